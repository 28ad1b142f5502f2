//! Where Gantry keeps its data by default: one answer for `gantry serve`, which writes the
//! store and the tokens there, and for the client commands, which read the local admin token
//! from there. Apart from both, so neither depends on the other for it.

use std::path::PathBuf;

/// `$XDG_DATA_HOME/gantry`, else `~/.local/share/gantry`, else `./gantry-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(dir).join("gantry");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/share/gantry"),
        None => PathBuf::from("gantry-data"),
    }
}
