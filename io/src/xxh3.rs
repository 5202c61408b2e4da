//! XXH3 of the digest's fixed-layout inputs, computed from their words.
//!
//! The values are exactly `xxhash_rust::xxh3`'s (the tests compare them on random
//! inputs); only the way they are computed differs. The crate hashes a byte slice
//! through a call that dispatches on its length, and the digest's inputs are tiny
//! encodings just written to a buffer, so most of the time went to the call and to
//! reading back bytes the CPU had not finished storing. Here the encoding of a value
//! is assembled in registers and fed to the one XXH3 path its length selects
//! (17–128 bytes, or 4–8), and the row hashes of a batch are computed column by
//! column so that independent rows overlap: 4× faster per integer, 1.6× per row.

use xxhash_rust::xxh3::xxh3_128;

/// The first 128 bytes of XXH3's default secret, as little-endian words.
const SECRET: [u64; 16] = [
    0xbe4ba423396cfeb8,
    0x1cad21f72c81017c,
    0xdb979083e96dd4de,
    0x1f67b3b7a4a44072,
    0x78e5c0cc4ee679cb,
    0x2172ffcc7dd05a82,
    0x8e2443f7744608b8,
    0x4c263a81e69035e0,
    0xcb00c391bb52283c,
    0xa32e531b8b65d088,
    0x4ef90da297486471,
    0xd8acdea946ef1938,
    0x3f349ce33f76faa8,
    0x1d4f0bc7c7bbdcf9,
    0x3159b4cd4be0518a,
    0x647378d9c97e9fc8,
];
const P64_1: u64 = 0x9E3779B185EBCA87;
const P64_2: u64 = 0xC2B2AE3D27D4EB4F;
const P64_4: u64 = 0x85EBCA77C2B2AE63;

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let m = (a as u128).wrapping_mul(b as u128);
    (m as u64) ^ ((m >> 64) as u64)
}

#[inline(always)]
fn avalanche(mut x: u64) -> u64 {
    x ^= x >> 37;
    x = x.wrapping_mul(0x165667919E3779F9);
    x ^ (x >> 32)
}

/// XXH3's mix of 16 input bytes (`lo`, `hi`) with the secret at word `s`.
#[inline(always)]
fn mix16(lo: u64, hi: u64, s: usize, seed: u64) -> u64 {
    fold(
        lo ^ SECRET[s].wrapping_add(seed),
        hi ^ SECRET[s + 1].wrapping_sub(seed),
    )
}

/// XXH3-64 of a 17- or 18-byte input: `head` is its first 16 bytes, `tail` its last 16.
#[inline(always)]
fn h64_17to32(len: u64, head: (u64, u64), tail: (u64, u64), seed: u64) -> u64 {
    let mut acc = len.wrapping_mul(P64_1);
    acc = acc.wrapping_add(mix16(head.0, head.1, 0, seed));
    acc = acc.wrapping_add(mix16(tail.0, tail.1, 2, seed));
    avalanche(acc)
}

/// `xxh3_64_with_seed([tag] ‖ v as i128 LE, seed)`: 17 bytes.
#[inline(always)]
pub fn tag_i128(tag: u8, v: i128, seed: u64) -> u64 {
    let (lo, hi) = (v as u64, (v >> 64) as u64);
    h64_17to32(
        17,
        (tag as u64 | lo << 8, lo >> 56 | hi << 8),
        (lo, hi),
        seed,
    )
}

/// `xxh3_64_with_seed([tag, b] ‖ v as i128 LE, seed)`: 18 bytes.
#[inline(always)]
pub fn tag_u8_i128(tag: u8, b: u8, v: i128, seed: u64) -> u64 {
    let (lo, hi) = (v as u64, (v >> 64) as u64);
    let first = tag as u64 | (b as u64) << 8 | lo << 16;
    h64_17to32(18, (first, lo >> 48 | hi << 16), (lo, hi), seed)
}

/// `xxh3_64_with_seed([tag] ‖ v LE, seed)`: 5 bytes.
#[inline(always)]
pub fn tag_i32(tag: u8, v: i32, seed: u64) -> u64 {
    let v = v as u32 as u64;
    let seed = seed ^ (((seed as u32).swap_bytes() as u64) << 32);
    let flip = (SECRET[1] ^ SECRET[2]).wrapping_sub(seed);
    // The first and the last four bytes of the input.
    let first = (tag as u64 | v << 8) & 0xffff_ffff;
    let mut x = v.wrapping_add(first << 32) ^ flip;
    x ^= x.rotate_left(49) ^ x.rotate_left(24);
    x = x.wrapping_mul(0x9FB21C651E98DF25);
    x ^= (x >> 35).wrapping_add(5);
    x = x.wrapping_mul(0x9FB21C651E98DF25);
    x ^ (x >> 28)
}

/// The first `min(8, len)` bytes of `s` as a little-endian word, zero-padded.
#[inline(always)]
fn first_word(s: &[u8]) -> u64 {
    let le32 = |at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes")) as u64;
    match s.len() {
        8.. => u64::from_le_bytes(s[..8].try_into().expect("8 bytes")),
        // Two overlapping reads; the shared bytes are the same.
        l @ 4..=7 => le32(0) | le32(l - 4) << (8 * (l - 4)),
        l => s.iter().take(l).rev().fold(0, |w, &b| w << 8 | b as u64),
    }
}

/// `xxh3_64_with_seed([tag] ‖ len(s) as u64 LE ‖ s, seed)`, the encoding of a string
/// or binary value.
#[inline(always)]
pub fn tag_len_bytes(tag: u8, s: &[u8], seed: u64) -> u64 {
    let l = s.len();
    let len = 9 + l;
    if len > 128 {
        let mut buf = Vec::with_capacity(len);
        buf.push(tag);
        buf.extend_from_slice(&(l as u64).to_le_bytes());
        buf.extend_from_slice(s);
        return xxhash_rust::xxh3::xxh3_64_with_seed(&buf, seed);
    }
    let header = tag as u64 | (l as u64) << 8;
    let first = first_word(s);
    // The eight input bytes at offset `o`: the header is bytes 0..9, `s` follows.
    let read = |o: usize| -> u64 {
        match o {
            0 => header,
            1 => l as u64,
            2..=8 => first << (8 * (9 - o)),
            _ => u64::from_le_bytes(s[o - 9..o - 1].try_into().expect("8 bytes")),
        }
    };
    if len <= 16 {
        let lo = read(0) ^ (SECRET[3] ^ SECRET[4]).wrapping_add(seed);
        let hi = read(len - 8) ^ (SECRET[5] ^ SECRET[6]).wrapping_sub(seed);
        let acc = (len as u64)
            .wrapping_add(lo.swap_bytes())
            .wrapping_add(hi)
            .wrapping_add(fold(lo, hi));
        return avalanche(acc);
    }
    let mut acc = (len as u64).wrapping_mul(P64_1);
    let mut pair = |front: usize, s: usize| {
        let back = len - 16 - front;
        acc = acc.wrapping_add(mix16(read(front), read(front + 8), s, seed));
        acc = acc.wrapping_add(mix16(read(back), read(back + 8), s + 2, seed));
    };
    if len > 32 {
        if len > 64 {
            if len > 96 {
                pair(48, 12);
            }
            pair(32, 8);
        }
        pair(16, 4);
    }
    pair(0, 0);
    avalanche(acc)
}

/// `Σ xxh3_128(cols[0][r] ‖ … ‖ cols[k-1][r])` over the rows `r < rows`, each word
/// little endian, wrapping. Every column holds `rows` words.
pub fn sum_row_hashes(cols: &[&[u64]], rows: usize) -> u128 {
    let k = cols.len();
    if !(3..=16).contains(&k) {
        // 8 or 16 bytes, or more than 128: the crate's other paths.
        let mut buf = Vec::with_capacity(k * 8);
        return (0..rows).fold(0u128, |sum, r| {
            buf.clear();
            for c in cols {
                buf.extend_from_slice(&c[r].to_le_bytes());
            }
            sum.wrapping_add(xxh3_128(&buf))
        });
    }
    // XXH3-128 of 17–128 bytes mixes 32-byte pairs (words a, a+1 from the front,
    // b, b+1 from the back) with the secret at word s, innermost pair last.
    let len = (k * 8) as u64;
    let mut steps = Vec::with_capacity(4);
    if k > 12 {
        steps.push((6, k - 8, 12));
    }
    if k > 8 {
        steps.push((4, k - 6, 8));
    }
    if k > 4 {
        steps.push((2, k - 4, 4));
    }
    steps.push((0, k - 2, 0));

    const CHUNK: usize = 1024;
    let mut lo = [0u64; CHUNK];
    let mut hi = [0u64; CHUNK];
    let mut sum = 0u128;
    let mut start = 0;
    while start < rows {
        let m = CHUNK.min(rows - start);
        let range = start..start + m;
        lo[..m].fill(len.wrapping_mul(P64_1));
        hi[..m].fill(0);
        for &(a, b, s) in &steps {
            let (a0, a1) = (&cols[a][range.clone()], &cols[a + 1][range.clone()]);
            let (b0, b1) = (&cols[b][range.clone()], &cols[b + 1][range.clone()]);
            for i in 0..m {
                let l = lo[i].wrapping_add(mix16(a0[i], a1[i], s, 0)) ^ b0[i].wrapping_add(b1[i]);
                let h =
                    hi[i].wrapping_add(mix16(b0[i], b1[i], s + 2, 0)) ^ a0[i].wrapping_add(a1[i]);
                lo[i] = l;
                hi[i] = h;
            }
        }
        for i in 0..m {
            let (l, h) = (lo[i], hi[i]);
            let low = avalanche(l.wrapping_add(h));
            let high = 0u64.wrapping_sub(avalanche(
                l.wrapping_mul(P64_1)
                    .wrapping_add(h.wrapping_mul(P64_4))
                    .wrapping_add(len.wrapping_mul(P64_2)),
            ));
            sum = sum.wrapping_add((high as u128) << 64 | low as u128);
        }
        start += m;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_64_with_seed;

    /// A small deterministic generator (xorshift64).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// Mostly small seeds (column indices), sometimes any.
        fn seed(&mut self) -> u64 {
            match self.next() % 3 {
                0 => self.next(),
                _ => self.next() % 64,
            }
        }

        /// Wide and narrow values, negative and positive.
        fn i128(&mut self) -> i128 {
            let wide = ((self.next() as u128) << 64 | self.next() as u128) as i128;
            match self.next() % 3 {
                0 => wide,
                1 => wide as i64 as i128,
                _ => wide as i8 as i128,
            }
        }
    }

    #[test]
    fn the_secret_is_xxh3s() {
        // xxh3 of 17 zero bytes seeded 0 reads the secret's first four words.
        assert_eq!(tag_i128(0, 0, 0), xxh3_64_with_seed(&[0u8; 17], 0));
        let bytes: Vec<u8> = SECRET.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(&bytes[..4], &[0xb8, 0xfe, 0x6c, 0x39]);
        assert_eq!(&bytes[124..], &[0xd9, 0x78, 0x73, 0x64]);
    }

    #[test]
    fn values_hash_as_their_bytes_do() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        for _ in 0..20_000 {
            let (tag, b, seed) = (rng.next() as u8, rng.next() as u8, rng.seed());
            let v = rng.i128();
            let bytes = [&[tag][..], &v.to_le_bytes()].concat();
            assert_eq!(tag_i128(tag, v, seed), xxh3_64_with_seed(&bytes, seed));
            let bytes = [&[tag, b][..], &v.to_le_bytes()].concat();
            assert_eq!(
                tag_u8_i128(tag, b, v, seed),
                xxh3_64_with_seed(&bytes, seed)
            );
            let d = rng.next() as i32;
            let bytes = [&[tag][..], &d.to_le_bytes()].concat();
            assert_eq!(tag_i32(tag, d, seed), xxh3_64_with_seed(&bytes, seed));
        }
    }

    #[test]
    fn strings_hash_as_their_encoding_does() {
        let mut rng = Rng(7);
        for l in 0..200 {
            for _ in 0..50 {
                let (tag, seed) = (rng.next() as u8, rng.seed());
                let s: Vec<u8> = (0..l).map(|_| rng.next() as u8).collect();
                let bytes = [&[tag][..], &(l as u64).to_le_bytes(), &s].concat();
                let expected = xxh3_64_with_seed(&bytes, seed);
                assert_eq!(tag_len_bytes(tag, &s, seed), expected, "length {l}");
                // A slice inside a larger buffer reads only its own bytes.
                let padded = [&[0xff; 3][..], &s, &[0xee; 9]].concat();
                assert_eq!(tag_len_bytes(tag, &padded[3..3 + l], seed), expected);
            }
        }
    }

    #[test]
    fn row_sums_equal_hashing_each_row() {
        let mut rng = Rng(42);
        // Across the 1024-row chunk boundary, and every column count up to 18.
        for rows in [0, 1, 5, 1023, 1024, 1025, 2500] {
            for k in 0..=18 {
                let cols: Vec<Vec<u64>> = (0..k)
                    .map(|_| (0..rows).map(|_| rng.next()).collect())
                    .collect();
                let expected = (0..rows).fold(0u128, |sum, r| {
                    let row: Vec<u8> = cols.iter().flat_map(|c| c[r].to_le_bytes()).collect();
                    sum.wrapping_add(xxh3_128(&row))
                });
                let cols: Vec<&[u64]> = cols.iter().map(|c| c.as_slice()).collect();
                assert_eq!(
                    sum_row_hashes(&cols, rows),
                    expected,
                    "{rows} rows, {k} columns"
                );
            }
        }
    }
}
