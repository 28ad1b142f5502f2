use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// An interned string. Node names, GPU types, queue names, taint keys and values cross the
/// policy boundary as these ids so that a call costs integers, not strings.
pub type Sym = u32;

/// The process-wide interner. Append-only, so an id never changes meaning and policies may cache
/// what they resolve. Id 0 is the empty string and means "none".
#[derive(Debug)]
pub struct Symbols {
    /// Behind a lock because policy host calls (`resolve`, `lookup`) read it from Wasm call
    /// threads while the cluster source interns new names.
    inner: RwLock<Interner>,
}

#[derive(Debug, Default)]
struct Interner {
    /// Looked up on every intern; the `Arc` is shared with `sym_to_text`.
    text_to_sym: HashMap<Arc<str>, Sym>,
    /// Indexed by `Sym`.
    sym_to_text: Vec<Arc<str>>,
}

impl Default for Symbols {
    fn default() -> Self {
        let symbols = Symbols {
            inner: RwLock::new(Interner::default()),
        };
        symbols.intern("");
        symbols
    }
}

impl Symbols {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The id of `text`, adding it if new.
    pub fn intern(&self, text: &str) -> Sym {
        if let Some(sym) = self.lookup(text) {
            return sym;
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&sym) = inner.text_to_sym.get(text) {
            return sym;
        }
        let sym = Sym::try_from(inner.sym_to_text.len()).expect("fewer than 2^32 symbols");
        let text: Arc<str> = Arc::from(text);
        inner.sym_to_text.push(text.clone());
        inner.text_to_sym.insert(text, sym);
        sym
    }

    /// The id of `text` if it was ever interned.
    pub fn lookup(&self, text: &str) -> Option<Sym> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.text_to_sym.get(text).copied()
    }

    /// The string behind `sym`; empty for an unknown id.
    pub fn resolve(&self, sym: Sym) -> Arc<str> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner
            .sym_to_text
            .get(sym as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    pub fn len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .sym_to_text
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_string_is_zero_and_ids_are_stable() {
        let symbols = Symbols::new();
        assert_eq!(symbols.intern(""), 0);
        let a = symbols.intern("A100");
        let b = symbols.intern("H100");
        assert_ne!(a, b);
        assert_eq!(symbols.intern("A100"), a);
        assert_eq!(&*symbols.resolve(b), "H100");
        assert_eq!(symbols.lookup("L4"), None);
        assert_eq!(&*symbols.resolve(999), "");
    }
}
