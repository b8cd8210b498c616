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
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    /// Of `total`, the waits of folder-bound callers (tenants).
    bound: usize,
    per: HashMap<String, usize>,
}

/// One open wait; dropping it frees the slot.
#[derive(Debug)]
pub struct Pass {
    gate: Arc<Gate>,
    caller: String,
    bound: bool,
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
            open: Mutex::new(Open::default()),
        })
    }

    /// How many waits folder-bound callers may hold together: a quarter of the total stays
    /// for unbound callers (the operator, the daemons), so tenants can never lock them out.
    fn bound_total(&self) -> usize {
        self.total - self.total / 4
    }

    /// A pass for `caller` (a folder-bound caller when `bound`), if every bound allows.
    pub fn enter(self: &Arc<Self>, caller: &str, bound: bool) -> Result<Pass, Full> {
        let mut g = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if g.total >= self.total || (bound && g.bound >= self.bound_total()) {
            return Err(Full::Total(self.total));
        }
        let mine = g.per.entry(caller.to_owned()).or_insert(0);
        if *mine >= self.per_caller {
            return Err(Full::Caller(self.per_caller));
        }
        *mine += 1;
        g.total += 1;
        if bound {
            g.bound += 1;
        }
        Ok(Pass {
            gate: self.clone(),
            caller: caller.to_owned(),
            bound,
        })
    }

    /// Waits open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut g = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        g.total = g.total.saturating_sub(1);
        if self.bound {
            g.bound = g.bound.saturating_sub(1);
        }
        if let Some(n) = g.per.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                g.per.remove(&self.caller);
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
        let a1 = g.enter("a", false).unwrap();
        let _a2 = g.enter("a", false).unwrap();
        assert_eq!(g.enter("a", false).unwrap_err(), Full::Caller(2));
        let _b1 = g.enter("b", false).unwrap();
        assert_eq!(g.enter("c", false).unwrap_err(), Full::Total(3));
        drop(a1);
        assert_eq!(g.open(), 2);
        g.enter("c", false).unwrap();
        assert_eq!(g.open(), 2, "a pass dropped at once frees its slot");
    }

    #[test]
    fn tenants_together_leave_a_quarter_to_unbound_callers() {
        let g = Gate::new(8, 8);
        let held: Vec<Pass> = (0..6)
            .map(|i| g.enter(&format!("operator@t{i}"), true).unwrap())
            .collect();
        assert_eq!(g.enter("operator@t9", true).unwrap_err(), Full::Total(8));
        let _op = g.enter("operator", false).unwrap();
        let _op2 = g.enter("operator", false).unwrap();
        assert_eq!(g.enter("operator", false).unwrap_err(), Full::Total(8));
        drop(held);
        g.enter("operator@t9", true).unwrap();
    }
}
