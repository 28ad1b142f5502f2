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

/// `gantry:policy@0.2.0`. Its `types` are 0.1.0's unchanged, so they are mapped onto the 0.1.0
/// Rust types above: [`crate::Pod`], [`crate::Nodes`] and every view work for both versions.
/// `host` (with `domain-name`) and `labels` are new, generated with the filter world.
///
/// Each world is included in a world of its own name (`filter-v0-2`, `score-v0-2`): the export
/// macro wit-bindgen makes is named after the world and exported at the crate root, where
/// 0.1.0's `filter` and `score` already have theirs. The component still exports and imports
/// exactly the `gantry:policy@0.2.0` interfaces, which is all the host reads.
pub mod v2 {
    pub mod filter {
        wit_bindgen::generate!({
            inline: "package gantry:sdk; world filter-v0-2 { include gantry:policy/filter@0.2.0; }",
            world: "gantry:sdk/filter-v0-2",
            path: "../../wit/policy-0.2.0",
            pub_export_macro: true,
            default_bindings_module: "gantry_policy_sdk::bindings::v2::filter",
            with: {
                "gantry:policy/types@0.2.0": crate::bindings::types,
                "gantry:policy/host@0.2.0": generate,
                "gantry:policy/labels@0.2.0": generate,
            },
        });
    }

    pub mod score {
        wit_bindgen::generate!({
            inline: "package gantry:sdk; world score-v0-2 { include gantry:policy/score@0.2.0; }",
            world: "gantry:sdk/score-v0-2",
            path: "../../wit/policy-0.2.0",
            pub_export_macro: true,
            default_bindings_module: "gantry_policy_sdk::bindings::v2::score",
            with: {
                "gantry:policy/types@0.2.0": crate::bindings::types,
                "gantry:policy/host@0.2.0": crate::bindings::v2::host,
                "gantry:policy/labels@0.2.0": crate::bindings::v2::labels,
            },
        });
    }

    pub use filter::gantry::policy::{host, labels};
}
