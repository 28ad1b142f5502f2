;; A valid component that exports no Gantry policy interface.
(component
  (core module $m (func (export "hello")))
  (core instance $i (instantiate $m))
  (func $hello (canon lift (core func $i "hello")))
  (export "hello" (func $hello)))
