"""Native CPU ops: a C library built for the host on first use (``build``), GGUF-style
block weights (``qweights``) and the small-step decoder that runs on them (``decoder``).
Everything degrades to the reference torch path when the library cannot be had."""
