//! GGUF metadata values: the [`Value`] type, the value-type ids and reading one value.

use std::fmt;

use super::{Reader, MAX_ARRAY_DEPTH};
use crate::error::Result;

/// The value types of GGUF metadata, by their ids in the file.
pub(super) mod vtype {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;

    /// The fewest bytes one value of type `t` takes in the file, `None` for an unknown type.
    pub fn min_size(t: u32) -> Option<usize> {
        Some(match t {
            U8 | I8 | BOOL => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            STRING => 8,    // the length
            ARRAY => 4 + 8, // element type and count
            _ => return None,
        })
    }

    pub fn name(t: u32) -> &'static str {
        match t {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            BOOL => "bool",
            STRING => "string",
            ARRAY => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
            _ => "unknown",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    /// Any unsigned integer, or a signed one that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any number, integer or float (not bools).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v as f64),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The type's name as used in error messages: `u8` … `f64`, `bool`, `string`, `array`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// The GGUF value-type id of this value (the type it would be written with).
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => vtype::U8,
            Value::I8(_) => vtype::I8,
            Value::U16(_) => vtype::U16,
            Value::I16(_) => vtype::I16,
            Value::U32(_) => vtype::U32,
            Value::I32(_) => vtype::I32,
            Value::U64(_) => vtype::U64,
            Value::I64(_) => vtype::I64,
            Value::F32(_) => vtype::F32,
            Value::F64(_) => vtype::F64,
            Value::Bool(_) => vtype::BOOL,
            Value::Str(_) => vtype::STRING,
            Value::Array(_) => vtype::ARRAY,
        }
    }

    /// "u32 7", "string \"llama\"", "array of 49152": a short description for error messages.
    pub(super) fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("an array of {}", a.len()),
            Value::Str(_) => format!("a string {self}"),
            v => format!("{} {v}", v.type_name()),
        }
    }
}

/// Human-readable, abbreviated: long strings and arrays are cut (with the full length shown).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX_STR: usize = 64;
        const MAX_ITEMS: usize = 8;
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Str(s) => {
                if s.chars().count() > MAX_STR {
                    let head: String = s.chars().take(MAX_STR).collect();
                    write!(f, "{head:?}… ({} bytes)", s.len())
                } else {
                    write!(f, "{s:?}")
                }
            }
            Value::Array(a) => {
                f.write_str("[")?;
                for (i, v) in a.iter().take(MAX_ITEMS).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                if a.len() > MAX_ITEMS {
                    write!(f, ", … ({} total)", a.len())?;
                }
                f.write_str("]")
            }
        }
    }
}

impl Reader<'_> {
    /// One value of type `ty`; `depth` is the number of arrays around it.
    pub(super) fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            vtype::U8 => Value::U8(self.u8("u8 value")?),
            vtype::I8 => Value::I8(self.u8("i8 value")? as i8),
            vtype::U16 => Value::U16(self.u16("u16 value")?),
            vtype::I16 => Value::I16(self.u16("i16 value")? as i16),
            vtype::U32 => Value::U32(self.u32("u32 value")?),
            vtype::I32 => Value::I32(self.u32("i32 value")? as i32),
            vtype::U64 => Value::U64(self.u64("u64 value")?),
            vtype::I64 => Value::I64(self.u64("i64 value")? as i64),
            vtype::F32 => Value::F32(f32::from_bits(self.u32("f32 value")?)),
            vtype::F64 => Value::F64(f64::from_bits(self.u64("f64 value")?)),
            vtype::BOOL => {
                let at = self.pos;
                match self.u8("bool value")? {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(format!(
                            "invalid bool byte {b} at offset {at} (must be 0 or 1)"
                        ))
                    }
                }
            }
            vtype::STRING => Value::Str(self.string("string value")?),
            vtype::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "arrays nested more than {MAX_ARRAY_DEPTH} deep at offset {}",
                        self.pos
                    ));
                }
                let at = self.pos;
                let et = self.u32("array element type")?;
                let min = vtype::min_size(et)
                    .ok_or_else(|| format!("array at offset {at} has unknown element type {et}"))?;
                let n = self.u64("array length")?;
                let rem = self.remaining();
                // Every element takes at least `min` bytes: a count the remaining bytes cannot
                // hold is rejected before anything is allocated.
                let n = match usize::try_from(n) {
                    Ok(n) if n <= rem / min => n,
                    _ => {
                        return Err(format!(
                            "array at offset {at} claims {n} {} elements (at least {min} bytes each) but only {rem} bytes remain (corrupt length or truncated file)",
                            vtype::name(et)
                        ))
                    }
                };
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    let v = self
                        .value(et, depth + 1)
                        .map_err(|e| format!("array element {i}: {e}"))?;
                    items.push(v);
                }
                Value::Array(items)
            }
            t => return Err(format!("unknown value type {t}")),
        })
    }
}
