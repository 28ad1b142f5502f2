//! The wit-bindgen output for the three worlds. `types` and `host` are generated once (with the
//! filter world) and shared by the other two, so every role uses the same Rust types. Exports are
//! emitted only where an `export_*!` macro runs, so a component carries exactly one world.

pub mod filter {
    wit_bindgen::generate!({
        world: "gantry:policy/filter@0.1.0",
        path: "../../wit/policy-0.1.0",
        pub_export_macro: true,
        default_bindings_module: "gantry_policy_sdk::bindings::filter",
    });
}

pub mod score {
    wit_bindgen::generate!({
        world: "gantry:policy/score@0.1.0",
        path: "../../wit/policy-0.1.0",
        pub_export_macro: true,
        default_bindings_module: "gantry_policy_sdk::bindings::score",
        with: {
            "gantry:policy/types@0.1.0": crate::bindings::types,
            "gantry:policy/host@0.1.0": crate::bindings::host,
        },
    });
}

pub mod quota {
    wit_bindgen::generate!({
        world: "gantry:policy/quota@0.1.0",
        path: "../../wit/policy-0.1.0",
        pub_export_macro: true,
        default_bindings_module: "gantry_policy_sdk::bindings::quota",
        with: {
            "gantry:policy/types@0.1.0": crate::bindings::types,
            "gantry:policy/host@0.1.0": crate::bindings::host,
        },
    });
}

pub use filter::gantry::policy::{host, types};
