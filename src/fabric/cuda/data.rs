//! Test data on the host: the same values kernels/check.cu draws on the GPU (the worker
//! checks the two agree), and the expected sum a wrong result is reported with. Values are
//! k/8 with 1 <= |k| <= 8, so every input is exact in bf16, fp16 and fp32 and every sum over
//! up to 16 ranks is exact too: results can be compared bit for bit, and a single wrong
//! element shows. The host reference (`reference`, `compare`) stays as the model the tests
//! hold the one-element answers to.

use crate::fabric::Dtype;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's finalizer: kernels/check.cu's mix64.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn rank_key(seed: u64, rank: usize) -> u64 {
    mix64(seed ^ (rank as u64 + 1).wrapping_mul(GOLDEN))
}

/// Element `i` of rank `rank`'s input for a run seeded by `seed`: k/8, k in ±1..=8 (never
/// zero). Counter-based, so the GPU (kernels/check.cu) draws the same value for any element
/// without drawing the ones before it.
pub fn value(seed: u64, rank: usize, i: u64) -> f32 {
    let x = mix64(rank_key(seed, rank).wrapping_add((i + 1).wrapping_mul(GOLDEN)));
    let k = ((x & 7) + 1) as f32 / 8.0;
    if x & 8 != 0 {
        k
    } else {
        -k
    }
}

/// Rank `rank`'s first `n` input values.
pub fn rank_values(seed: u64, rank: usize, n: usize) -> Vec<f32> {
    (0..n as u64).map(|i| value(seed, rank, i)).collect()
}

/// The expected output at element `i` over `world` ranks, as `dtype` bits.
pub fn expected_bits(dtype: Dtype, seed: u64, world: usize, i: u64) -> u32 {
    let sum: f32 = (0..world).map(|r| value(seed, r, i)).sum();
    bits(dtype, sum)
}

fn bits(dtype: Dtype, v: f32) -> u32 {
    match dtype {
        Dtype::Bf16 => f32_to_bf16(v) as u32,
        Dtype::Fp16 => f32_to_f16(v) as u32,
        Dtype::Fp32 => v.to_bits(),
    }
}

fn from_bits(dtype: Dtype, b: u32) -> f32 {
    match dtype {
        Dtype::Bf16 => bf16_to_f32(b as u16),
        Dtype::Fp16 => f16_to_f32(b as u16),
        Dtype::Fp32 => f32::from_bits(b),
    }
}

/// The sentence for a wrong output: its first differing element, the value found and the one
/// expected, and how many differ.
pub fn mismatch(dtype: Dtype, i: u64, n: u64, got: u32, want: u32, count: u64) -> String {
    let w = dtype.size() as usize * 2;
    format!(
        "element {i} of {n} is {} (0x{got:0w$x}), expected {} (0x{want:0w$x}); {count} of {n} elements differ",
        from_bits(dtype, got),
        from_bits(dtype, want)
    )
}

/// fp32 -> bf16 bits, round to nearest even (NaN stays NaN).
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return 0x7fc0;
    }
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1));
    (rounded >> 16) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// fp32 -> fp16 bits, round to nearest even, with subnormals, overflow to infinity and NaN.
pub fn f32_to_f16(f: f32) -> u16 {
    let u = f.to_bits();
    let sign = ((u >> 16) & 0x8000) as u16;
    let exp = ((u >> 23) & 0xff) as i32;
    let man = u & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut v = m >> shift;
        if rest > half || (rest == half && (v & 1) == 1) {
            v += 1;
        }
        return sign | v as u16;
    }
    let mut v = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (v & 1) == 1) {
        v += 1; // may carry into the exponent, which is still correct (up to infinity)
    }
    sign | v as u16
}

pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalize.
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Encodes values as `dtype` in little-endian bytes.
pub fn encode(dtype: Dtype, v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * dtype.size() as usize);
    for &x in v {
        match dtype {
            Dtype::Bf16 => out.extend_from_slice(&f32_to_bf16(x).to_le_bytes()),
            Dtype::Fp16 => out.extend_from_slice(&f32_to_f16(x).to_le_bytes()),
            Dtype::Fp32 => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
    out
}

#[cfg(test)]
/// Decodes element `i` of `bytes` to (raw bits, value).
pub fn element(dtype: Dtype, bytes: &[u8], i: usize) -> (u32, f32) {
    match dtype {
        Dtype::Bf16 | Dtype::Fp16 => {
            let h = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
            let f = if dtype == Dtype::Bf16 {
                bf16_to_f32(h)
            } else {
                f16_to_f32(h)
            };
            (h as u32, f)
        }
        Dtype::Fp32 => {
            let b = u32::from_le_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ]);
            (b, f32::from_bits(b))
        }
    }
}

#[cfg(test)]
/// The expected output: per element, the fp32 sum over ranks 0, 1, ... in order, rounded once
/// to `dtype` (the kernels' order and rounding).
pub fn reference(dtype: Dtype, inputs: &[Vec<f32>]) -> Vec<u8> {
    let n = inputs.first().map_or(0, |v| v.len());
    let mut sum = vec![0f32; n];
    for r in inputs {
        for (s, x) in sum.iter_mut().zip(r) {
            // Inputs round-trip through dtype exactly (they are k/8), so add them as they are.
            *s += *x;
        }
    }
    encode(dtype, &sum)
}

#[cfg(test)]
/// Compares `got` with `want` bit for bit. None when equal; otherwise a sentence naming the
/// first differing element, its expected and actual values, and how many differ.
pub fn compare(dtype: Dtype, got: &[u8], want: &[u8]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "output has {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    let size = dtype.size() as usize;
    let n = want.len() / size;
    let mut first = None;
    let mut count = 0usize;
    for i in 0..n {
        if got[i * size..(i + 1) * size] != want[i * size..(i + 1) * size] {
            count += 1;
            if first.is_none() {
                first = Some(i);
            }
        }
    }
    first.map(|i| {
        let (gb, _) = element(dtype, got, i);
        let (wb, _) = element(dtype, want, i);
        mismatch(dtype, i as u64, n as u64, gb, wb, count as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_nonzero_eighths_and_seeded() {
        let a = rank_values(7, 3, 1000);
        assert_eq!(a, rank_values(7, 3, 1000));
        assert_ne!(a, rank_values(7, 4, 1000));
        assert_ne!(a, rank_values(8, 3, 1000));
        for x in &a {
            let k = x * 8.0;
            assert!(k != 0.0 && k.abs() <= 8.0 && k.fract() == 0.0, "{x}");
        }
    }

    #[test]
    fn sums_of_sixteen_ranks_are_exact_in_every_dtype() {
        let inputs: Vec<Vec<f32>> = (0..16).map(|r| rank_values(1, r, 4096)).collect();
        for d in [Dtype::Bf16, Dtype::Fp16, Dtype::Fp32] {
            let want = reference(d, &inputs);
            for i in 0..4096 {
                let exact: f32 = inputs.iter().map(|v| v[i]).sum();
                assert_eq!(element(d, &want, i).1, exact, "{d:?} element {i}");
            }
        }
    }

    #[test]
    fn half_conversions_round_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie -> even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie -> even (up)
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.5), 0xc100);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert_eq!(f32_to_f16(f32::from_bits(0x3f80_1000)), 0x3c00); // tie -> even
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // smallest subnormal
        for h in [0x0001u16, 0x03ff, 0x0400, 0x3c00, 0xc100, 0x7bff] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h);
        }
        assert!(f16_to_f32(0x7e00).is_nan());
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn expected_bits_are_the_reference_at_one_element() {
        let inputs: Vec<Vec<f32>> = (0..8).map(|r| rank_values(3, r, 512)).collect();
        for d in [Dtype::Bf16, Dtype::Fp16, Dtype::Fp32] {
            let want = reference(d, &inputs);
            for i in [0u64, 1, 17, 511] {
                assert_eq!(
                    expected_bits(d, 3, 8, i),
                    element(d, &want, i as usize).0,
                    "{d:?} {i}"
                );
            }
        }
    }

    #[test]
    fn values_are_counter_based() {
        let v = rank_values(9, 2, 300);
        assert_eq!(value(9, 2, 299), v[299]);
        // Both signs and all eight magnitudes occur.
        let mut seen = std::collections::BTreeSet::new();
        for x in &v {
            seen.insert((x * 8.0) as i32);
        }
        assert_eq!(seen.len(), 16, "{seen:?}");
    }

    #[test]
    fn compare_names_the_first_difference() {
        let want = encode(Dtype::Bf16, &[1.0, 2.0, 3.0]);
        assert_eq!(compare(Dtype::Bf16, &want, &want), None);
        let got = encode(Dtype::Bf16, &[1.0, 2.5, 3.5]);
        let msg = compare(Dtype::Bf16, &got, &want).unwrap();
        assert!(
            msg.starts_with("element 1 of 3 is 2.5 (0x4020), expected 2 (0x4000); 2 of 3"),
            "{msg}"
        );
    }
}
