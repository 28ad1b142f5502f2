;; One core module with one memory, instantiated eight times; each instance grows its memory by
;; 16 MiB as it starts. A per-memory cap lets every instance have its own 64 MiB; the sum over the
;; store stops it at the fourth. Needs the instance-count limit raised to 8.
(component
  (core module $m
    (memory 1)
    (func $start
      (if (i32.eq (memory.grow (i32.const 256)) (i32.const -1)) (then unreachable)))
    (start $start))
  (core instance (instantiate $m))
  (core instance (instantiate $m))
  (core instance (instantiate $m))
  (core instance (instantiate $m))
  (core instance (instantiate $m))
  (core instance (instantiate $m))
  (core instance (instantiate $m))
  (core instance (instantiate $m)))
