;; Eight memories in one core module, each grown by 16 MiB when the module starts: with a
;; per-memory cap each would fit, so only a cap on the sum of every memory of the store stops it
;; (at the fourth grow under the default 64 MiB). Needs the memory-count limit raised to 8; the
;; sandbox tests do that to show the sum holds whatever the count limit.
(component
  (core module $m
    (memory $m0 1)
    (memory $m1 1)
    (memory $m2 1)
    (memory $m3 1)
    (memory $m4 1)
    (memory $m5 1)
    (memory $m6 1)
    (memory $m7 1)
    (func $start
      (if (i32.eq (memory.grow $m0 (i32.const 256)) (i32.const -1)) (then unreachable))
      (if (i32.eq (memory.grow $m1 (i32.const 256)) (i32.const -1)) (then unreachable))
      (if (i32.eq (memory.grow $m2 (i32.const 256)) (i32.const -1)) (then unreachable))
      (if (i32.eq (memory.grow $m3 (i32.const 256)) (i32.const -1)) (then unreachable))
      (if (i32.eq (memory.grow $m4 (i32.const 256)) (i32.const -1)) (then unreachable))
      (if (i32.eq (memory.grow $m5 (i32.const 256)) (i32.const -1)) (then unreachable))
      (if (i32.eq (memory.grow $m6 (i32.const 256)) (i32.const -1)) (then unreachable))
      (if (i32.eq (memory.grow $m7 (i32.const 256)) (i32.const -1)) (then unreachable))
    )
    (start $start))
  (core instance (instantiate $m)))
