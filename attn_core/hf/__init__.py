"""Local Hugging Face model folders: import into attn-lab's Transformer (one converter module
per family) and export our models as a transformers folder. Only JSON and safetensors are read;
``transformers`` is never needed to import a model.
"""

from attn_core.hf.gpt2 import (
    convert_state_dict,
    from_transformers,
    is_gpt2_folder,
    load_gpt2,
    model_config,
)

__all__ = ["convert_state_dict", "from_transformers", "is_gpt2_folder", "load_gpt2", "model_config"]
