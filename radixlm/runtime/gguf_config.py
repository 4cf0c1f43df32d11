"""What transformers' GGUF config reader leaves out (the families beyond Llama/Qwen2)."""

from __future__ import annotations

import numpy as np

FULL, SLIDING = "full_attention", "sliding_attention"


def config_fixups(config, path) -> None:
    """Set what transformers' GGUF config reader leaves at a default although the file (or
    llama.cpp's own rules) says otherwise: head_dim, soft-caps, the attention scale, sliding
    windows, partial rotary, Gemma 3's rope scaling and Phi-3's longrope factors. Llama,
    Mistral and Qwen2 need none (the file is not read again for them)."""
    import gguf

    if config.model_type not in ("qwen3", "gemma2", "gemma3_text", "phi3"):
        return
    reader = gguf.GGUFReader(str(path))
    arch = str(reader.fields["general.architecture"].contents())

    def field(key: str):
        f = reader.fields.get(key.format(arch=arch))
        return None if f is None else f.contents()

    mt = config.model_type
    head_dim = field(gguf.Keys.Attention.KEY_LENGTH)
    if head_dim and mt == "qwen3":
        config.head_dim = int(head_dim)
    if mt in ("gemma2", "gemma3_text"):
        for key, attr in ((gguf.Keys.LLM.ATTN_LOGIT_SOFTCAPPING, "attn_logit_softcapping"),
                          (gguf.Keys.LLM.FINAL_LOGIT_SOFTCAPPING, "final_logit_softcapping")):
            if mt == "gemma2" or field(key) is not None:
                setattr(config, attr, field(key))
        # llama.cpp: the 27B models scale by (hidden / heads) ** -0.5, the others by head_dim
        big = config.num_hidden_layers == (46 if mt == "gemma2" else 62)
        config.query_pre_attn_scalar = (config.hidden_size // config.num_attention_heads
                                        if big else config.head_dim)
        pattern = field(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN)
        if mt == "gemma3_text" and pattern is not None:  # an int n (every n-th layer is
            # global), or one bool per layer (true: sliding)
            sliding = ([bool((i + 1) % int(pattern)) for i in range(config.num_hidden_layers)]
                       if isinstance(pattern, int) else [bool(x) for x in pattern])
            config.layer_types = [SLIDING if x else FULL for x in sliding]
        if mt == "gemma3_text" and field(gguf.Keys.Rope.FREQ_BASE_SWA) is not None:
            config.rope_parameters["sliding_attention"]["rope_theta"] = float(
                field(gguf.Keys.Rope.FREQ_BASE_SWA))
        if mt == "gemma3_text" and field(gguf.Keys.Rope.SCALING_TYPE) == "linear":
            config.rope_parameters["full_attention"].update(
                rope_type="linear", factor=float(field(gguf.Keys.Rope.SCALING_FACTOR)))
    if mt == "phi3":
        window = field(gguf.Keys.Attention.SLIDING_WINDOW)
        config.sliding_window = int(window) if window else None
        rot = field(gguf.Keys.Rope.DIMENSION_COUNT)
        head = config.hidden_size // config.num_attention_heads
        if rot and int(rot) != head:
            config.rope_parameters["partial_rotary_factor"] = int(rot) / head
        factors = {t.name.split(".")[0]: np.asarray(t.data, dtype=np.float32).tolist()
                   for t in reader.tensors if t.name.startswith("rope_factors_")}
        if factors:
            orig = int(field(gguf.Keys.Rope.SCALING_ORIG_CTX_LEN))
            config.original_max_position_embeddings = orig
            config.rope_parameters.update(
                rope_type="longrope", long_factor=factors["rope_factors_long"],
                short_factor=factors["rope_factors_short"],
                original_max_position_embeddings=orig)
            if field(gguf.Keys.Rope.SCALING_ATTN_FACTOR) is not None:
                config.rope_parameters["attention_factor"] = float(
                    field(gguf.Keys.Rope.SCALING_ATTN_FACTOR))
