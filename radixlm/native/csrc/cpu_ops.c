/* The native library as one translation unit: build.py compiles this file, which includes
 * the parts in the order of their dependencies (see rlm.h for why one unit). */
#include "rlm.h"

#include "pool.c"
#include "blocks.c"
#include "dense.c"
#include "matmul_f32.c"
#include "matmul_bf16.c"
#include "amx.c"
#include "matmul_i8.c"
#include "kquants.c"
#include "kx.c"
#include "kx32.c"
#include "amx_i8.c"
#include "matmul.c"
#include "vmath.c"
#include "attention.c"
#include "layer.c"
