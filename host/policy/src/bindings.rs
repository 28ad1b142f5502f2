//! The only `bindgen!` in Gantry: host bindings for the three `gantry:policy@0.1.0` worlds.
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
