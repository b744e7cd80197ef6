//! The vectors the index searches by meaning, held in memory for a brute-force scan: every
//! passage's unit vector as 384 signed bytes and one scale (int8, a quarter of the floats' size
//! and memory traffic), rows of one text side by side, so a text's score is the best of its rows
//! in one pass. The floats stay in SQLite (`vectors`), the truth this is rebuilt from.

use crate::embed::DIM;

/// Quantized passage vectors of every embedded text.
#[derive(Debug, Default)]
pub struct Matrix {
    /// The text hash of each text, in the order its rows were pushed.
    texts: Vec<String>,
    /// Per row: which text it belongs to (an index into `texts`).
    owner: Vec<u32>,
    /// Per row: the float a byte stands for (its vector's largest magnitude / 127).
    scale: Vec<f32>,
    /// Rows of [`DIM`] bytes, end to end.
    rows: Vec<i8>,
}

impl Matrix {
    /// Adds a text's passage vectors (`vectors` holds them end to end, [`DIM`] floats each).
    pub fn push(&mut self, hash: String, vectors: &[f32]) {
        let text = self.texts.len() as u32;
        for v in vectors.chunks_exact(DIM) {
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
            self.rows.extend(v.iter().map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8));
            self.scale.push(scale);
            self.owner.push(text);
        }
        self.texts.push(hash);
    }

    /// The `n` texts nearest `query` (a unit vector), best first, with their cosine (that of
    /// their nearest passage); `keep` says which text hashes may be found.
    pub fn nearest(
        &self,
        query: &[f32],
        n: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<(f32, &str)> {
        let mut best: Vec<(f32, u32)> = Vec::with_capacity(self.texts.len());
        for (row, (&owner, &scale)) in self.owner.iter().zip(&self.scale).enumerate() {
            let score = scale * dot(query, &self.rows[row * DIM..(row + 1) * DIM]);
            match best.last_mut() {
                Some((s, o)) if *o == owner => *s = s.max(score),
                _ => best.push((score, owner)),
            }
        }
        best.retain(|(_, o)| keep(&self.texts[*o as usize]));
        let n = n.min(best.len());
        if n == 0 {
            return Vec::new();
        }
        best.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
        best.truncate(n);
        best.sort_by(|a, b| b.0.total_cmp(&a.0));
        best.into_iter().map(|(s, o)| (s, self.texts[o as usize].as_str())).collect()
    }
}

/// `Σ q[i] · r[i]` in sixteen running sums, so the compiler can keep them in vector registers
/// (one running sum would chain every addition on the one before).
fn dot(q: &[f32], r: &[i8]) -> f32 {
    let mut acc = [0f32; 16];
    let (qs, rs) = (q.chunks_exact(16), r.chunks_exact(16));
    let tail: f32 = qs.remainder().iter().zip(rs.remainder()).map(|(a, b)| a * f32::from(*b)).sum();
    for (a, b) in qs.zip(rs) {
        for i in 0..16 {
            acc[i] += a[i] * f32::from(b[i]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f32> = (0..DIM)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
        v.into_iter().map(|a| a / n).collect()
    }

    fn exact(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn a_text_scores_its_nearest_passage_and_int8_keeps_the_order() {
        let q = unit(1);
        let mut m = Matrix::default();
        // Text "a": a far passage and q itself; "b": one middling passage.
        let mut a = unit(2);
        a.extend(&q);
        let mut middling: Vec<f32> = q.iter().zip(unit(3)).map(|(x, y)| x + y).collect();
        let n = middling.iter().map(|x| x * x).sum::<f32>().sqrt();
        middling.iter_mut().for_each(|x| *x /= n);
        m.push("a".into(), &a);
        m.push("b".into(), &middling);
        for s in 4..200 {
            m.push(format!("r{s}"), &unit(s));
        }
        let found = m.nearest(&q, 3, |_| true);
        assert_eq!(found[0].1, "a");
        assert!((found[0].0 - 1.0).abs() < 0.01, "{found:?}");
        assert_eq!(found[1].1, "b");
        assert!((found[1].0 - exact(&q, &middling)).abs() < 0.01, "{found:?}");
        assert_eq!(m.nearest(&q, 2, |h| h != "a")[0].1, "b");
        assert_eq!((m.texts.len(), m.owner.len()), (198, 199));
    }

    #[test]
    fn the_quantized_dot_product_is_within_a_percent() {
        for s in 0..50 {
            let (a, b) = (unit(s), unit(s + 1000));
            let mut m = Matrix::default();
            m.push("x".into(), &b);
            let got = m.nearest(&a, 1, |_| true)[0].0;
            assert!((got - exact(&a, &b)).abs() < 0.01, "{got} vs {}", exact(&a, &b));
        }
    }
}
