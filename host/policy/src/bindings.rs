//! The only `bindgen!` in Gantry: host bindings for the three worlds of `gantry:policy@0.1.0`
//! and of `gantry:policy@0.2.0` (in [`v2`]).
//! `types` and `host` are generated with the filter world and shared by the other two, so every
//! role converts through the same Rust types and the `host` import is implemented once.

pub mod filter {
    wasmtime::component::bindgen!({
        world: "gantry:policy/filter@0.1.0",
        path: "../../wit/policy-0.1.0",
    });
}

pub mod score {
    wasmtime::component::bindgen!({
        world: "gantry:policy/score@0.1.0",
        path: "../../wit/policy-0.1.0",
        with: {
            "gantry:policy/types": crate::bindings::types,
            "gantry:policy/host": crate::bindings::host,
        },
    });
}

pub mod quota {
    wasmtime::component::bindgen!({
        world: "gantry:policy/quota@0.1.0",
        path: "../../wit/policy-0.1.0",
        with: {
            "gantry:policy/types": crate::bindings::types,
            "gantry:policy/host": crate::bindings::host,
        },
    });
}

pub use filter::gantry::policy::{host, types};

/// `gantry:policy@0.2.0`. Its `types` interface is 0.1.0's unchanged, so it is mapped onto the
/// 0.1.0 Rust types above (the component model checks records by shape, not by package): a
/// [`crate::WasmNodes`] is lent as is to policies of either version. `host` (with
/// `domain-name`) and `labels` are new, generated once with the filter world and shared.
pub mod v2 {
    pub mod filter {
        wasmtime::component::bindgen!({
            world: "gantry:policy/filter@0.2.0",
            path: "../../wit/policy-0.2.0",
            with: {
                "gantry:policy/types": crate::bindings::types,
            },
        });
    }

    pub mod score {
        wasmtime::component::bindgen!({
            world: "gantry:policy/score@0.2.0",
            path: "../../wit/policy-0.2.0",
            with: {
                "gantry:policy/types": crate::bindings::types,
                "gantry:policy/host": crate::bindings::v2::host,
                "gantry:policy/labels": crate::bindings::v2::labels,
            },
        });
    }

    pub mod quota {
        wasmtime::component::bindgen!({
            world: "gantry:policy/quota@0.2.0",
            path: "../../wit/policy-0.2.0",
            with: {
                "gantry:policy/types": crate::bindings::types,
                "gantry:policy/host": crate::bindings::v2::host,
            },
        });
    }

    pub use filter::gantry::policy::{host, labels};
}
