// The graph engine's kernels: one per op family, one thread per output
// element, no shared memory, no __syncthreads and no includes, so that the
// same text compiles with NVRTC for the GPU (exec/cuda.rs) and with a C++
// compiler over a tiny shim for the CPU (cpu_shim.cpp, exec/graph/cpu.rs),
// where it is checked against ONNX Runtime. Every kernel takes the arena
// (all tensors, as float offsets) and one SymArgs by value; the argument
// layout of each is written next to it and produced by exec/graph/plan.rs.

struct SymArgs {
    long long i[28];
    float f[4];
};

#define SYM_INDEX() \
    long long idx = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x; \
    if (idx >= a.i[0]) return;

// Conv2d, NCHW, grouped, with fused bias and activation.
// i: 0 n, 1 C, 2 H, 3 W, 4 K, 5 OH, 6 OW, 7 KH, 8 KW, 9 SH, 10 SW, 11 PH, 12 PW,
//    13 DH, 14 DW, 15 groups, 16 x, 17 w, 18 bias (-1: none), 19 y, 20 act (0 none, 1 relu)
extern "C" __global__ void sym_conv(float* m, SymArgs a) {
    SYM_INDEX();
    long long C = a.i[1], H = a.i[2], W = a.i[3], K = a.i[4], OH = a.i[5], OW = a.i[6];
    long long KH = a.i[7], KW = a.i[8], SH = a.i[9], SW = a.i[10], PH = a.i[11], PW = a.i[12];
    long long DH = a.i[13], DW = a.i[14], G = a.i[15];
    long long ow = idx % OW, oh = (idx / OW) % OH, k = (idx / (OW * OH)) % K, b = idx / (OW * OH * K);
    long long cpg = C / G, kpg = K / G, c0 = (k / kpg) * cpg;
    const float* x = m + a.i[16] + (b * C + c0) * H * W;
    const float* w = m + a.i[17] + k * cpg * KH * KW;
    float acc = a.i[18] >= 0 ? m[a.i[18] + k] : 0.0f;
    for (long long c = 0; c < cpg; c++) {
        for (long long kh = 0; kh < KH; kh++) {
            long long ih = oh * SH - PH + kh * DH;
            if (ih < 0 || ih >= H) continue;
            for (long long kw = 0; kw < KW; kw++) {
                long long iw = ow * SW - PW + kw * DW;
                if (iw < 0 || iw >= W) continue;
                acc += x[(c * H + ih) * W + iw] * w[(c * KH + kh) * KW + kw];
            }
        }
    }
    if (a.i[20] == 1 && acc < 0.0f) acc = 0.0f;
    m[a.i[19] + idx] = acc;
}

// Max or average pooling, NCHW (global average pooling: the window is the image).
// i: 0 n, 1 C, 2 H, 3 W, 4 OH, 5 OW, 6 KH, 7 KW, 8 SH, 9 SW, 10 PH, 11 PW, 12 x, 13 y,
//    14 kind (0 max, 1 average over the window's pixels inside the image, 2 average over
//    the whole window, padding counted)
extern "C" __global__ void sym_pool(float* m, SymArgs a) {
    SYM_INDEX();
    long long H = a.i[2], W = a.i[3], OH = a.i[4], OW = a.i[5];
    long long KH = a.i[6], KW = a.i[7], SH = a.i[8], SW = a.i[9], PH = a.i[10], PW = a.i[11];
    long long kind = a.i[14];
    long long ow = idx % OW, oh = (idx / OW) % OH, plane = idx / (OW * OH);
    const float* x = m + a.i[12] + plane * H * W;
    float acc = kind == 0 ? -3.402823466e38f : 0.0f;
    long long count = 0;
    for (long long kh = 0; kh < KH; kh++) {
        long long ih = oh * SH - PH + kh;
        if (ih < 0 || ih >= H) continue;
        for (long long kw = 0; kw < KW; kw++) {
            long long iw = ow * SW - PW + kw;
            if (iw < 0 || iw >= W) continue;
            float v = x[ih * W + iw];
            if (kind == 0) {
                acc = v > acc ? v : acc;
            } else {
                acc += v;
            }
            count++;
        }
    }
    if (kind == 1) acc = count > 0 ? acc / (float)count : 0.0f;
    if (kind == 2) acc = acc / (float)(KH * KW);
    m[a.i[13] + idx] = acc;
}

// Elementwise binary op with numpy broadcasting over 6 dimensions.
// i: 0 n, 1 op (0 add, 1 sub, 2 mul, 3 div), 2 a, 3 b, 4 y, 5..11 output dims,
//    11..17 a's strides (0 where broadcast), 17..23 b's strides
extern "C" __global__ void sym_binary(float* m, SymArgs a) {
    SYM_INDEX();
    long long rest = idx, ia = 0, ib = 0;
    for (int d = 5; d >= 0; d--) {
        long long dim = a.i[5 + d];
        long long q = rest % dim;
        rest /= dim;
        ia += q * a.i[11 + d];
        ib += q * a.i[17 + d];
    }
    float u = m[a.i[2] + ia], v = m[a.i[3] + ib], r;
    switch (a.i[1]) {
    case 0: r = u + v; break;
    case 1: r = u - v; break;
    case 2: r = u * v; break;
    default: r = u / v; break;
    }
    m[a.i[4] + idx] = r;
}

// Elementwise unary op.
// i: 0 n, 1 op (0 relu, 1 clip to [f0, f1], 2 hard sigmoid max(0, min(1, f0 * x + f1)), 3 copy),
//    2 x, 3 y
extern "C" __global__ void sym_unary(float* m, SymArgs a) {
    SYM_INDEX();
    float v = m[a.i[2] + idx];
    switch (a.i[1]) {
    case 0: v = v > 0.0f ? v : 0.0f; break;
    case 1: v = v < a.f[0] ? a.f[0] : (v > a.f[1] ? a.f[1] : v); break;
    case 2: v = a.f[0] * v + a.f[1]; v = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v); break;
    default: break;
    }
    m[a.i[3] + idx] = v;
}

// Per-channel affine map y = x * scale[c] + shift[c] (batch normalisation not after a conv).
// i: 0 n, 1 C, 2 inner (elements per channel plane), 3 x, 4 scale, 5 shift, 6 y
extern "C" __global__ void sym_channel_affine(float* m, SymArgs a) {
    SYM_INDEX();
    long long c = (idx / a.i[2]) % a.i[1];
    m[a.i[6] + idx] = m[a.i[3] + idx] * m[a.i[4] + c] + m[a.i[5] + c];
}

// Row-major [R, K] x [K, N] (+ bias[N]); R covers any leading dimensions.
// i: 0 n (R * N), 1 K, 2 N, 3 a, 4 b, 5 y, 6 bias (-1: none)
extern "C" __global__ void sym_matmul(float* m, SymArgs a) {
    SYM_INDEX();
    long long K = a.i[1], N = a.i[2];
    long long r = idx / N, col = idx % N;
    const float* x = m + a.i[3] + r * K;
    const float* w = m + a.i[4] + col;
    float acc = a.i[6] >= 0 ? m[a.i[6] + col] : 0.0f;
    for (long long k = 0; k < K; k++) acc += x[k] * w[k * N];
    m[a.i[5] + idx] = acc;
}

// Softmax over rows of D elements (ONNX opset < 13: the input coerced to 2-D at the axis).
// i: 0 n, 1 D, 2 x, 3 y
extern "C" __global__ void sym_softmax(float* m, SymArgs a) {
    SYM_INDEX();
    long long D = a.i[1];
    const float* x = m + a.i[2] + (idx / D) * D;
    float mx = x[0];
    for (long long j = 1; j < D; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
    for (long long j = 0; j < D; j++) sum += expf(x[j] - mx);
    m[a.i[3] + idx] = expf(x[idx % D] - mx) / sum;
}

// Transpose (any permutation of up to 6 dimensions).
// i: 0 n, 1 x, 2 y, 3..9 output dims, 9..15 the input stride of each output dimension
extern "C" __global__ void sym_transpose(float* m, SymArgs a) {
    SYM_INDEX();
    long long rest = idx, ix = 0;
    for (int d = 5; d >= 0; d--) {
        long long dim = a.i[3 + d];
        ix += (rest % dim) * a.i[9 + d];
        rest /= dim;
    }
    m[a.i[2] + idx] = m[a.i[1] + ix];
}
