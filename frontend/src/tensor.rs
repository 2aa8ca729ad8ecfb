//! Tensor datatypes and shapes of the Open Inference Protocol, the decoding
//! of JSON tensor data into little-endian bytes, and the deterministic
//! reference output every emulated model computes.

use serde_json::Value;

/// Element types of the protocol: the tree's one datatype enum (also
/// the repository's and the ONNX executor's), with both spellings.
pub use scheduler_core::repository::DataType;

/// Bytes per element of `dt`, as a length.
fn elem_size(dt: DataType) -> usize {
    dt.size() as usize
}

/// Encodes one JSON scalar as `dt`, little-endian, into `out` (exactly
/// `dt.size()` bytes). `None` if the value is not a number (or bool)
/// representable in the type.
fn encode_scalar(dt: DataType, v: &Value, out: &mut [u8]) -> Option<()> {
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value) -> Option<T> {
        if let Some(u) = v.as_u64() {
            T::try_from(u).ok()
        } else {
            T::try_from(v.as_i64()?).ok()
        }
    }
    match dt {
        DataType::Bool => out[0] = u8::from(v.as_bool()?),
        DataType::U8 => out.copy_from_slice(&int::<u8>(v)?.to_le_bytes()),
        DataType::U16 => out.copy_from_slice(&int::<u16>(v)?.to_le_bytes()),
        DataType::U32 => out.copy_from_slice(&int::<u32>(v)?.to_le_bytes()),
        DataType::U64 => out.copy_from_slice(&int::<u64>(v)?.to_le_bytes()),
        DataType::I8 => out.copy_from_slice(&int::<i8>(v)?.to_le_bytes()),
        DataType::I16 => out.copy_from_slice(&int::<i16>(v)?.to_le_bytes()),
        DataType::I32 => out.copy_from_slice(&int::<i32>(v)?.to_le_bytes()),
        DataType::I64 => out.copy_from_slice(&int::<i64>(v)?.to_le_bytes()),
        DataType::F32 => out.copy_from_slice(&(v.as_f64()? as f32).to_le_bytes()),
        DataType::F64 => out.copy_from_slice(&v.as_f64()?.to_le_bytes()),
    }
    Some(())
}

/// Decodes one little-endian element of `dt` as JSON.
fn decode_scalar(dt: DataType, b: &[u8]) -> Value {
    let a = |n: usize| -> [u8; 8] {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(&b[..n]);
        x
    };
    match dt {
        DataType::Bool => Value::Bool(b[0] != 0),
        DataType::U8 => Value::from(b[0]),
        DataType::U16 => Value::from(u16::from_le_bytes([b[0], b[1]])),
        DataType::U32 => Value::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::U64 => Value::from(u64::from_le_bytes(a(8))),
        DataType::I8 => Value::from(b[0] as i8),
        DataType::I16 => Value::from(i16::from_le_bytes([b[0], b[1]])),
        DataType::I32 => Value::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::I64 => Value::from(i64::from_le_bytes(a(8))),
        DataType::F32 => Value::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
        DataType::F64 => Value::from(f64::from_le_bytes(a(8))),
    }
}

/// A named tensor with a fixed datatype and shape (model metadata).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name (`INPUT0`).
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Dimensions; all positive (no variable dimensions are served).
    pub shape: Vec<u64>,
}

impl TensorSpec {
    /// A tensor spec.
    pub fn new(name: &str, datatype: DataType, shape: &[u64]) -> Self {
        TensorSpec {
            name: name.to_string(),
            datatype,
            shape: shape.to_vec(),
        }
    }
    /// Number of elements (product of the shape).
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
    /// Bytes of the whole tensor.
    pub fn byte_len(&self) -> u64 {
        self.elements() * u64::from(self.datatype.size())
    }
}

/// Why tensor data was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataError {
    /// The flattened data does not have the expected number of elements.
    Count {
        /// Elements the shape requires.
        expected: u64,
        /// Elements found (counting stops once past `expected`).
        got: u64,
    },
    /// An element is not a value of the datatype.
    Element(DataType),
    /// Nesting deeper than the shape allows.
    TooDeep,
}

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataError::Count { expected, got } => {
                write!(
                    f,
                    "tensor data has {got} elements, shape requires {expected}"
                )
            }
            DataError::Element(t) => {
                write!(f, "tensor data holds a value that is not {}", t.kserve_name())
            }
            DataError::TooDeep => write!(f, "tensor data nested deeper than its shape"),
        }
    }
}

/// Flattens JSON tensor data (a flat array, nested row-major arrays, or a
/// single scalar for one element) into `out` as little-endian `dt`
/// elements. `out.len()` must be `elements * dt.size()`; the data must
/// fill it exactly. Never panics and never allocates.
pub fn encode_json_data(data: &Value, dt: DataType, out: &mut [u8]) -> Result<(), DataError> {
    let size = elem_size(dt);
    let expected = (out.len() / size) as u64;
    let mut n: usize = 0;
    // Depth bounded by the recursion limit serde_json itself enforces (128).
    fn walk(
        v: &Value,
        dt: DataType,
        out: &mut [u8],
        n: &mut usize,
        depth: u32,
    ) -> Result<(), DataError> {
        if depth > 64 {
            return Err(DataError::TooDeep);
        }
        match v {
            Value::Array(items) => {
                for it in items {
                    walk(it, dt, out, n, depth + 1)?;
                }
                Ok(())
            }
            scalar => {
                let size = elem_size(dt);
                let at = *n * size;
                *n += 1;
                match out.get_mut(at..at + size) {
                    Some(dst) => encode_scalar(dt, scalar, dst).ok_or(DataError::Element(dt)),
                    // Keep counting (no writes) to report the real length.
                    None => Ok(()),
                }
            }
        }
    }
    walk(data, dt, out, &mut n, 0)?;
    if n as u64 != expected {
        return Err(DataError::Count {
            expected,
            got: n as u64,
        });
    }
    Ok(())
}

/// Decodes little-endian `dt` elements into a flat JSON array.
pub fn decode_to_json(bytes: &[u8], dt: DataType) -> Value {
    Value::Array(
        bytes
            .chunks_exact(elem_size(dt))
            .map(|c| decode_scalar(dt, c))
            .collect(),
    )
}

/// The output model `model_id` computes from its staged input bytes,
/// written into `out` (the model's output length): the cluster-wide
/// reference every executor writes and every verifier checks,
/// [`dataplane::reference::expected_output`]. Different for different
/// inputs and models, so a response delivered to the wrong client is
/// caught. Arbitrary bytes, which is why the default output tensor is
/// `UINT8` (JSON cannot carry the NaNs an `FP32` view of them would hold).
pub fn reference_output(model_id: u32, input: &[u8], out: &mut [u8]) {
    dataplane::reference::expected_output(model_id, input, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flat_and_nested_data_encode_alike_and_bad_data_is_refused() {
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        encode_json_data(&json!([1, 2.5, 3, 4]), DataType::F32, &mut a).unwrap();
        encode_json_data(&json!([[1, 2.5], [3, 4]]), DataType::F32, &mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            decode_to_json(&a, DataType::F32),
            json!([1.0, 2.5, 3.0, 4.0])
        );
        assert_eq!(
            encode_json_data(&json!([1, 2, 3]), DataType::F32, &mut a),
            Err(DataError::Count {
                expected: 4,
                got: 3
            })
        );
        assert_eq!(
            encode_json_data(&json!([1, 2, 3, 4, 5]), DataType::F32, &mut a),
            Err(DataError::Count {
                expected: 4,
                got: 5
            })
        );
        assert_eq!(
            encode_json_data(&json!([1, "x", 3, 4]), DataType::F32, &mut a),
            Err(DataError::Element(DataType::F32))
        );
        let mut c = [0u8; 4];
        assert_eq!(
            encode_json_data(&json!([1, 300, 3, -1]), DataType::U8, &mut c),
            Err(DataError::Element(DataType::U8))
        );
        encode_json_data(&json!([1, 255, 3, 0]), DataType::U8, &mut c).unwrap();
        assert_eq!(c, [1, 255, 3, 0]);
        assert!(DataType::from_kserve("BYTES").is_none());
        assert_eq!(DataType::from_kserve("INT64").unwrap().size(), 8);
    }

    #[test]
    fn reference_output_is_the_shared_one_and_depends_on_model_and_input() {
        let mut x = [0u8; 40];
        let mut y = [0u8; 40];
        let mut z = [0u8; 40];
        reference_output(3, &[1, 2, 3], &mut x);
        reference_output(3, &[1, 2, 4], &mut y);
        reference_output(4, &[1, 2, 3], &mut z);
        assert_ne!(x, y);
        assert_ne!(x, z);
        let mut shared = [0u8; 40];
        dataplane::reference::expected_output(3, &[1, 2, 3], &mut shared);
        assert_eq!(x, shared);
    }
}
