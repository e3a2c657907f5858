//! Order-preserving key encoding for redb keys.
//!
//! Byte strings are escaped (`0x00` becomes `0x00 0xFF`) and terminated by `0x00 0x01`, so a
//! shorter string sorts before any longer string it prefixes and no component can run into the
//! next. Signed integers flip their sign bit and are written big-endian, so negative times sort
//! before positive ones.

use crate::error::{Error, Result};

const ESCAPE: u8 = 0x00;
const ESCAPED_ZERO: u8 = 0xFF;
const TERMINATOR: u8 = 0x01;

pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        if b == ESCAPE {
            out.extend_from_slice(&[ESCAPE, ESCAPED_ZERO]);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&[ESCAPE, TERMINATOR]);
}

pub fn put_i64(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(&((value as u64) ^ (1 << 63)).to_be_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_be_bytes());
}

/// Reads encoded components back, in order.
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    pub fn bytes(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.rest.len() {
            let b = self.rest[i];
            if b == ESCAPE {
                match self.rest.get(i + 1) {
                    Some(&ESCAPED_ZERO) => out.push(0),
                    Some(&TERMINATOR) => {
                        self.rest = &self.rest[i + 2..];
                        return Ok(out);
                    }
                    _ => break,
                }
                i += 2;
            } else {
                out.push(b);
                i += 1;
            }
        }
        Err(Error::Corruption("malformed key: unterminated byte string".into()))
    }

    pub fn i64(&mut self) -> Result<i64> {
        Ok((self.u64()? ^ (1 << 63)) as i64)
    }

    pub fn u64(&mut self) -> Result<u64> {
        if self.rest.len() < 8 {
            return Err(Error::Corruption("malformed key: truncated integer".into()));
        }
        let (head, rest) = self.rest.split_at(8);
        self.rest = rest;
        Ok(u64::from_be_bytes(head.try_into().expect("8 bytes")))
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

/// The smallest key greater than every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xFF; prefix.len() + 1]
}

#[cfg(test)]
mod tests {
    use super::{Reader, prefix_end, put_bytes, put_i64};

    fn enc(parts: &[&[u8]], t: i64) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            put_bytes(&mut out, p);
        }
        put_i64(&mut out, t);
        out
    }

    #[test]
    fn order_is_preserved_for_bytes_and_times() {
        // Sorted by hand: a shorter string sorts before any string it prefixes, byte strings
        // containing 0x00 after those without at that position, times numerically.
        let mut keys = vec![
            enc(&[b"a", b""], 5),
            enc(&[b"a", b"\0"], -5),
            enc(&[b"a", b"b"], i64::MIN),
            enc(&[b"a", b"b"], -1),
            enc(&[b"a", b"b"], 0),
            enc(&[b"a", b"b"], i64::MAX),
            enc(&[b"a\0", b""], 0),
            enc(&[b"ab", b""], 0),
        ];
        let expected = keys.clone();
        keys.reverse();
        keys.sort();
        assert_eq!(keys, expected);
    }

    #[test]
    fn round_trip() {
        let mut out = Vec::new();
        put_bytes(&mut out, b"x\0y");
        put_i64(&mut out, -42);
        put_bytes(&mut out, b"");
        let mut r = Reader::new(&out);
        assert_eq!(r.bytes().unwrap(), b"x\0y");
        assert_eq!(r.i64().unwrap(), -42);
        assert_eq!(r.bytes().unwrap(), b"");
        assert!(r.is_empty());
    }

    #[test]
    fn prefix_end_bounds_the_prefix() {
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(&[1, 0xFF]), vec![2]);
        assert!(prefix_end(b"ab").as_slice() > b"ab\xff\xff".as_slice());
    }
}
