"""A shard from its weights: only the layers a node serves, in the precision it computes in.

``shard.load_shard`` builds the model on torch's meta device and gives real
tensors to the shard's layers only (the embeddings on the head, the final
norm and LM head on the tail): ``weights`` plans and reads them from a
safetensors or GGUF checkpoint through transformers' conversions,
``quantization`` and ``precision`` apply the operator's dtype and
quantisation, ``memory`` hands freed memory back to the system, ``tiny``
builds the seeded tiny model, and ``footprint`` says what a shard will hold
(for placement). Where the weights come from is ``nodes_app.shared.sources``.
"""
