"""Writing outputs: folders published in one step (``staged_folder``) and safetensors files
(``safetensors_writer``).
"""
