;; A core WebAssembly module, not a component: Gantry must say so and say how to fix it.
(module
  (func (export "filter") (result i32) i32.const 0))
