"""Local Hugging Face model folders: the families of ``families/`` (one file each, one registry
line), imported into attn-lab's Transformer (``load_hf``; the config readers in ``config.py``, the
generic slot path in ``family.py``, GPT-2's layout in ``gpt2.py``, the folder in ``folder.py``, the
tokenizer in ``tokenizer.py``). Only JSON and safetensors are read; ``transformers`` is never needed to import
a model.
"""

from attn_core.hf.families import FAMILIES
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
