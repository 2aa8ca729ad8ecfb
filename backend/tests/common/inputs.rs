//! Deterministic model inputs shared by the ONNX Runtime and graph-engine
//! tests, so both feed the models the same values for a seed.

/// `n` floats in [0, 1) from a xorshift stream seeded by `seed`.
pub fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}
