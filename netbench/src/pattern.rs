//! The contents of served objects: a deterministic pattern from the object
//! index, so a reader can check what landed without being told the bytes.

/// Word `w` of object `object` (splitmix64 of a mix of both).
fn word(object: u32, w: u64) -> u64 {
    let mut z =
        (u64::from(object) << 40) ^ w.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x6E65_7462_656E_6368;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `dst` with the first `dst.len()` bytes of object `object`.
pub fn fill(dst: &mut [u8], object: u32) {
    for (w, chunk) in dst.chunks_mut(8).enumerate() {
        let bytes = word(object, w as u64).to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Checks that `got` is object `object`'s first `got.len()` bytes; on a
/// mismatch returns the offset of the first wrong byte.
pub fn verify(got: &[u8], object: u32) -> Result<(), usize> {
    for (w, chunk) in got.chunks(8).enumerate() {
        let bytes = word(object, w as u64).to_le_bytes();
        if chunk != &bytes[..chunk.len()] {
            let i = chunk
                .iter()
                .zip(bytes.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(w * 8 + i);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_verify_and_detect_changes() {
        let mut a = vec![0u8; 1001];
        fill(&mut a, 3);
        assert_eq!(verify(&a, 3), Ok(()));
        assert!(verify(&a, 4).is_err(), "objects differ");
        a[517] ^= 1;
        assert_eq!(verify(&a, 3), Err(517));
        let mut z = vec![0u8; 64];
        fill(&mut z, 0);
        assert!(z.iter().any(|&b| b != 0), "object 0 is not all zeros");
    }
}
