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
    let t = std::time::Instant::now();
    let mut bytes = 0usize;
    for i in 0..records {
        bytes += serde_json::to_vec(&gantry_store::sample_explanation(i))?.len();
    }
    eprintln!(
        "json alone: {:.0} records/s, {} bytes avg",
        records as f64 / t.elapsed().as_secs_f64(),
        bytes as u64 / records.max(1)
    );
    let result = gantry_store::bench_append(&dir.path().join("store"), records, batch)?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}
