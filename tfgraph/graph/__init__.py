"""The op graph: tensor types (``tensor``), the op table with every fact about each op
(``ops``, ``ops_loss``, ``ops_moe``), the IR (``ir``: ``Graph``, ``Node``, ``NodeMeta``,
``GraphInfo``), lowering from a spec (``lower``, ``rope``), the rule for lengths past
``max_len`` (``lengths``), initial weights (``weights``) and the JSON form of a graph
(``serialize``). Back ends read graphs from here and nothing else of the core.
"""
