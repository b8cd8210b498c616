//! Token ids: unique, unguessable, and in time order.
//!
//! A jti is 16 bytes, 6 of milliseconds since the epoch (big-endian) then 10 random (80 bits),
//! written in 22 characters of an ASCII-ordered URL-safe alphabet, so that ids sort as text in
//! the order they were made. That order is what keeps minting cheap: `issued_tokens` is keyed
//! by jti, and ids that grow append to the end of the B-tree, so a group commit of many mints
//! dirties a page or two instead of one random page per mint (measured: the SQLite thread's
//! cost per mint roughly halves). The time it reveals is already in the token's `iat`.

use base64::Engine as _;
use base64::alphabet::Alphabet;
use base64::engine::{GeneralPurpose, GeneralPurposeConfig};

/// The base64url characters in ASCII order, so that encoded ids sort like their bytes.
const SORTED: &str = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz";

/// Length of a jti.
pub const LEN: usize = 22;

/// The encoder; a bad alphabet would fail the build, not a request.
const ENGINE: GeneralPurpose = GeneralPurpose::new(
    &match Alphabet::new(SORTED) {
        Ok(a) => a,
        Err(_) => panic!("SORTED is not a base64 alphabet"),
    },
    GeneralPurposeConfig::new().with_encode_padding(false),
);

/// Random bytes per jti.
const RANDOM: usize = 10;
/// jtis served per `getrandom` call: one system call per mint was measurable.
const POOLED: usize = 64;

/// Operating-system randomness, drawn [`POOLED`] jtis' worth at a time, per thread.
struct Pool {
    bytes: [u8; RANDOM * POOLED],
    used: usize,
}

impl Pool {
    fn take(&mut self, out: &mut [u8; RANDOM]) -> Result<(), getrandom::Error> {
        if self.used == self.bytes.len() {
            getrandom::fill(&mut self.bytes)?;
            self.used = 0;
        }
        out.copy_from_slice(&self.bytes[self.used..self.used + RANDOM]);
        self.used += RANDOM;
        Ok(())
    }
}

thread_local! {
    static POOL: std::cell::RefCell<Pool> = const {
        std::cell::RefCell::new(Pool { bytes: [0; RANDOM * POOLED], used: RANDOM * POOLED })
    };
}

/// The jti of time `ms` (Unix milliseconds, 48 bits) and `random`.
fn encode(ms: i64, random: &[u8; RANDOM]) -> String {
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.max(0).to_be_bytes()[2..]);
    b[6..].copy_from_slice(random);
    ENGINE.encode(b)
}

/// A fresh jti for a token made at `now_ms` (Unix milliseconds).
pub fn new(now_ms: i64) -> Result<String, getrandom::Error> {
    let mut random = [0u8; RANDOM];
    POOL.with_borrow_mut(|p| p.take(&mut random))?;
    Ok(encode(now_ms, &random))
}

/// The smallest jti made at or after `ms`: every id from then on sorts at or above it.
pub fn floor(ms: i64) -> String {
    encode(ms, &[0; RANDOM])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_is_sorted_url_safe_and_complete() {
        let bytes = SORTED.as_bytes();
        assert_eq!(bytes.len(), 64);
        assert!(bytes.windows(2).all(|w| w[0] < w[1]));
        assert!(
            bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        );
        assert!(Alphabet::new(SORTED).is_ok());
    }

    #[test]
    fn ids_sort_in_time_order_and_do_not_repeat() {
        let mut ids = Vec::new();
        // Across byte and character boundaries of the time prefix.
        for ms in [
            0i64,
            1,
            63,
            64,
            255,
            256,
            4095,
            4096,
            1_763_900_000_000,
            1_763_900_000_001,
        ] {
            for _ in 0..50 {
                ids.push((ms, new(ms).unwrap()));
            }
        }
        for w in ids.windows(2) {
            assert_eq!(w[1].1.len(), LEN);
            if w[0].0 < w[1].0 {
                assert!(w[0].1 < w[1].1, "{w:?}");
            }
        }
        for (ms, id) in &ids {
            assert!(floor(*ms) <= *id && *id < floor(ms + 1), "{ms} {id}");
        }
        let mut all: Vec<&String> = ids.iter().map(|(_, id)| id).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), ids.len());
    }
}
