//! `cargo run --release -p gantry-store --example bench_store -- [records] [batch]`: the store's
//! append rate as JSON, the same figure `gantry bench store --json` reports.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let records: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(200_000);
    let batch: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let dir = tempfile::tempdir()?;
    let result = gantry_store::bench_append(&dir.path().join("store"), records, batch)?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}
