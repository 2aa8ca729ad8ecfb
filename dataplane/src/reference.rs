//! The reference output: what every executor (emulated or CUDA) computes for
//! one input of a model, so that a frontend, a load generator or a test
//! can verify a response byte for byte without a model.
//!
//! A word-wise FNV-1a-style hash (8 bytes per multiply, so hashing costs
//! little next to the copies even for 150 KiB inputs):
//! `h = 0xcbf29ce484222325`; fold in the model id, then every full 8-byte
//! little-endian word of the input, then each remaining byte, then the
//! input length, each fold being `h = (h ^ x) * 0x100000001b3`.
//! Output byte `j` = byte `j % 8` of `h` (little endian) XOR `j / 8`
//! (truncated to 8 bits). The CUDA kernel computes the same thing (see
//! `exec::cuda`, feature `cuda`).

/// Bytes of the input every frontend declares for a model served with the
/// default tensors (`INPUT0`, FP32 `[1, 16]`): the input slot a backend
/// needs for such models.
pub const DEFAULT_INPUT_BYTES: u32 = 16 * 4;
/// Bytes of the output of a model served with the default tensors
/// (`OUTPUT0`, UINT8 `[1, 40]`): the reference output length every
/// executor produces for such models.
pub const DEFAULT_OUTPUT_BYTES: u32 = 40;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

#[inline]
fn fold(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(FNV_PRIME)
}

/// Running hash of one input; `update` may be called with any split of
/// the input.
#[derive(Clone, Copy, Debug)]
pub struct OutputHasher {
    h: u64,
    /// Bytes of an incomplete word carried to the next `update`.
    carry: [u8; 8],
    carry_len: usize,
    len: u64,
}

impl OutputHasher {
    /// Starts the hash for `model_id`.
    pub fn new(model_id: u32) -> Self {
        OutputHasher {
            h: fold(FNV_OFFSET, u64::from(model_id)),
            carry: [0; 8],
            carry_len: 0,
            len: 0,
        }
    }

    /// Adds input bytes.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.carry_len > 0 {
            let take = (8 - self.carry_len).min(bytes.len());
            self.carry[self.carry_len..self.carry_len + take].copy_from_slice(&bytes[..take]);
            self.carry_len += take;
            bytes = &bytes[take..];
            if self.carry_len < 8 {
                return;
            }
            self.h = fold(self.h, u64::from_le_bytes(self.carry));
            self.carry_len = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.h = fold(self.h, u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carry_len = rest.len();
    }

    /// The final hash (the hasher itself is unchanged).
    pub fn finish(&self) -> u64 {
        let mut h = self.h;
        for &b in &self.carry[..self.carry_len] {
            h = fold(h, u64::from(b));
        }
        fold(h, self.len)
    }

    /// Writes the output for the hashed input into `out` (its length is the
    /// model's output length).
    pub fn fill(&self, out: &mut [u8]) {
        let h = self.finish().to_le_bytes();
        for (j, o) in out.iter_mut().enumerate() {
            *o = h[j % 8] ^ (j / 8) as u8;
        }
    }
}

/// The output `model_id` produces for `input`, written into `out`.
pub fn expected_output(model_id: u32, input: &[u8], out: &mut [u8]) {
    let mut h = OutputHasher::new(model_id);
    h.update(input);
    h.fill(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_on_model_and_every_input_byte() {
        let input: Vec<u8> = (0..37u32).map(|i| (i * 11) as u8).collect();
        let mut a = [0u8; 24];
        let mut b = [0u8; 24];
        expected_output(1, &input, &mut a);
        expected_output(2, &input, &mut b);
        assert_ne!(a, b);
        for i in 0..input.len() {
            let mut changed = input.clone();
            changed[i] ^= 1;
            expected_output(1, &changed, &mut b);
            assert_ne!(a, b, "byte {i} matters");
        }
        expected_output(1, &input[..36], &mut b);
        assert_ne!(a, b, "length matters");
        assert_eq!(a[8], a[0] ^ 1, "second word is xored with 1");
    }

    #[test]
    fn any_split_gives_the_same_hash() {
        let input: Vec<u8> = (0..100u32).map(|i| (i * 37 + 5) as u8).collect();
        let mut want = [0u8; 16];
        expected_output(9, &input, &mut want);
        for cut1 in 0..input.len() {
            for cut2 in [
                cut1,
                (cut1 + 3).min(input.len()),
                (cut1 + 13).min(input.len()),
            ] {
                let mut h = OutputHasher::new(9);
                h.update(&input[..cut1]);
                h.update(&input[cut1..cut2]);
                h.update(&input[cut2..]);
                let mut got = [0u8; 16];
                h.fill(&mut got);
                assert_eq!(got, want, "split at {cut1}/{cut2}");
            }
        }
    }
}
