// The CUDA built-ins kernels.cu uses, for a C++ compiler: the grid indices
// become thread-local globals that symphony_graph_cpu_launch steps through, one thread
// after another, so the kernels run unchanged on the CPU (they share no
// memory between threads and never synchronise). Built by backend/build.rs.
#include <math.h>

namespace {
struct SymDim {
    unsigned int x, y, z;
};
// Per thread: tests (and callers) run plans on several threads at once.
thread_local SymDim blockIdx, threadIdx, blockDim, gridDim;
}  // namespace

#define __global__
#include "kernels.cu"

typedef void (*SymKernel)(float*, SymArgs);

// In the order of exec/graph/plan.rs's Kernel.
static const SymKernel SYM_KERNELS[] = {
    sym_conv, sym_pool, sym_binary, sym_unary, sym_channel_affine, sym_matmul, sym_softmax, sym_transpose,
};

// Runs kernel `id` over `blocks` x `threads` on `arena`; returns 0, or -1 for an unknown kernel.
extern "C" int symphony_graph_cpu_launch(unsigned int id, float* arena, const SymArgs* args,
                                         unsigned int blocks, unsigned int threads) {
    if (id >= sizeof(SYM_KERNELS) / sizeof(SYM_KERNELS[0])) return -1;
    SymKernel k = SYM_KERNELS[id];
    gridDim.x = blocks;
    blockDim.x = threads;
    for (blockIdx.x = 0; blockIdx.x < blocks; blockIdx.x++)
        for (threadIdx.x = 0; threadIdx.x < threads; threadIdx.x++) k(arena, *args);
    return 0;
}
