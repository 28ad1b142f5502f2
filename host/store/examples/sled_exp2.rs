fn main() {
    let n: u64 = 300_000;
    for mode in [
        "seq-small",
        "rand-small",
        "rand-small-lowspace",
        "rand-small-bigcache",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg =
            sled::Config::new()
                .path(dir.path())
                .cache_capacity(if mode.ends_with("bigcache") {
                    512 << 20
                } else {
                    64 << 20
                });
        if !mode.ends_with("lowspace") {
            cfg = cfg.mode(sled::Mode::HighThroughput);
        }
        let db = cfg.open().unwrap();
        let t0 = db.open_tree("t").unwrap();
        let t = std::time::Instant::now();
        for b in 0..n / 1000 {
            let mut batch = sled::Batch::default();
            for i in 0..1000u64 {
                let x = b * 1000 + i;
                let mut k = if mode == "seq-small" {
                    Vec::new()
                } else {
                    format!("node-{:05}", (x * 7919) % 7500).into_bytes()
                };
                k.push(0);
                k.extend_from_slice(&x.to_be_bytes());
                k.extend_from_slice(&x.to_be_bytes());
                batch.insert(k, &[][..]);
            }
            t0.apply_batch(batch).unwrap();
        }
        db.flush().unwrap();
        println!(
            "{mode}: {:.0}/s  disk {}",
            n as f64 / t.elapsed().as_secs_f64(),
            db.size_on_disk().unwrap()
        );
    }
}
