//! Bounds on the callers that wait: SSE streams and long-polls each hold a pass for as long as
//! they stay open, at most `per_caller` per token subject and `total` overall. A caller past
//! either bound is told so (429) instead of pinning memory and connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The counter of open waits.
#[derive(Debug)]
pub struct Gate {
    total: usize,
    per_caller: usize,
    open: Mutex<(usize, HashMap<String, usize>)>,
}

/// One open wait; dropping it frees the slot.
#[derive(Debug)]
pub struct Pass {
    gate: Arc<Gate>,
    caller: String,
}

/// Why a wait was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// This caller has too many open.
    #[error("this caller already has {0} streams or long-polls open; close one first")]
    Caller(usize),
    /// The daemon has too many open.
    #[error("the daemon already serves {0} streams or long-polls; try again shortly")]
    Total(usize),
}

impl Gate {
    /// A gate allowing `total` waits overall and `per_caller` per caller.
    pub fn new(total: usize, per_caller: usize) -> Arc<Gate> {
        Arc::new(Gate {
            total,
            per_caller,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A pass for `caller`, if both bounds allow.
    pub fn enter(self: &Arc<Self>, caller: &str) -> Result<Pass, Full> {
        let mut g = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per) = &mut *g;
        if *total >= self.total {
            return Err(Full::Total(self.total));
        }
        let mine = per.entry(caller.to_owned()).or_insert(0);
        if *mine >= self.per_caller {
            return Err(Full::Caller(self.per_caller));
        }
        *mine += 1;
        *total += 1;
        Ok(Pass {
            gate: self.clone(),
            caller: caller.to_owned(),
        })
    }

    /// Waits open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut g = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per) = &mut *g;
        *total = total.saturating_sub(1);
        if let Some(n) = per.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_per_caller_and_overall() {
        let g = Gate::new(3, 2);
        let a1 = g.enter("a").unwrap();
        let _a2 = g.enter("a").unwrap();
        assert_eq!(g.enter("a").unwrap_err(), Full::Caller(2));
        let _b1 = g.enter("b").unwrap();
        assert_eq!(g.enter("c").unwrap_err(), Full::Total(3));
        drop(a1);
        assert_eq!(g.open(), 2);
        g.enter("c").unwrap();
        assert_eq!(g.open(), 2, "a pass dropped at once frees its slot");
    }
}
