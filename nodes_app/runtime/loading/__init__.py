"""A shard from its weights: only the layers a node serves, in the precision it computes in.

``shard.load_shard`` builds the model on torch's meta device and gives real
tensors to the shard's layers only (the embeddings on the head, the final
norm and LM head on the tail): ``weights`` plans and reads them from a
safetensors or GGUF checkpoint through transformers' conversions,
``quantization`` and ``precision`` apply the operator's dtype and
quantisation, ``memory`` hands freed memory back to the system, ``tiny``
builds the seeded tiny model, ``footprint`` says what a shard will hold
(for placement), and ``draft`` loads a head's draft model whole. Where the
weights come from is ``nodes_app.shared.sources``.
"""

import transformers.utils
import transformers.utils.import_utils


def _torchao_hidden_from_transformers() -> None:
    """Tell transformers torchao is not installed, before any module here imports a model
    class.

    transformers imports torchao (when it is installed) as soon as any model
    class is imported — its torchao quantizer's module reaches for torchao's
    prototypes — which cost a node start over a second and filled its log
    with torchao's warnings about CUDA kernels a CPU build cannot load. A node
    never loads a checkpoint torchao quantised: it quantises int8 itself
    (``quantization``), importing torchao only then. Should transformers stop
    asking this way, nothing changes but the time.
    """

    def unavailable(*args: object, **kwargs: object) -> bool:
        return False

    for module in (transformers.utils.import_utils, transformers.utils):
        setattr(module, "is_torchao_available", unavailable)  # noqa: B010


_torchao_hidden_from_transformers()
