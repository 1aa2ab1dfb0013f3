/* sass_probe.cu: a kernel for tests/test_sass_ctrl.sh (compiled to a cubin
 * by the Makefile when nvcc is present): a loop of 16-byte global loads,
 * each feeding an int8 tensor-core MMA, so that its SASS holds LDG, IMMA,
 * a branch and an EXIT, and the MMA waits on the load's scoreboard. */
extern "C" __global__ void sass_probe(const int4 *in, int *out, int n) {
    int d0 = 0, d1 = 0, d2 = 0, d3 = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int4 v = in[i];
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};"
                     : "+r"(d0), "+r"(d1), "+r"(d2), "+r"(d3)
                     : "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(v.x), "r"(v.y));
    }
    out[threadIdx.x] = d0 + d1 + d2 + d3;
}
