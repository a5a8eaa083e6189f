"""Local Hugging Face model folders: the families gpt2, gpt_neox, llama, mistral and qwen2,
imported into attn-lab's Transformer (``load_hf``; the config in ``config.py``, the tensor
layouts in ``gpt2.py`` and ``families.py``, the folder in ``folder.py``, the tokenizer in
``tokenizer.py``). Only JSON and safetensors are read; ``transformers`` is never needed to import
a model.
"""

from attn_core.hf.config import FAMILIES
from attn_core.hf.folder import INDEX, hf_config
from attn_core.hf.gpt2 import convert_state_dict, from_transformers
from attn_core.hf.load import is_hf_folder, load_hf, model_config

__all__ = [
    "FAMILIES",
    "INDEX",
    "hf_config",
    "convert_state_dict",
    "from_transformers",
    "is_hf_folder",
    "load_hf",
    "model_config",
]
