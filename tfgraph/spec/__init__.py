"""The spec language: the pydantic ``Spec`` and its validation (``schema``), strict YAML
reading with file:line:col errors (``safe_yaml``, ``loader``, ``errors``), rotary settings
(``rope``), what a SPEC argument brings (``source``), specs stored in built models
(``stored``) and short lines for mismatched tensor names (``name_mismatch``). Lowering
(``tfgraph.graph.lower``) and the commands read a ``Spec``; back ends never import this
package.
"""
