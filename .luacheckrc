-- .luacheckrc — luacheck (Debian's lua-check) over the Lua sources; tests/spec/lint_spec.lua runs it in
-- `make test`. It catches accidental globals, unused locals and values, shadowing and unreachable code.
std = "luajit"
max_line_length = false
-- 212: unused arguments: method signatures and callbacks keep their parameters' names (self, al, opts, ...)
-- 581: `not (x > 0)` is how the sources reject NaN with the rest (x <= 0 would let it through)
ignore = { "212", "581" }
exclude_files = { "build/", "notes/", ".gpu-deps/", "lib/" }

-- the globals tests/spec/helper.lua defines for every spec (busted loads it first, see .busted)
local spec_globals = { "HAS_GPU", "with_env", "hopper_missing" }
files["tests/spec"] = { std = "+busted", read_globals = spec_globals }
files["tests/spec/helper.lua"] = { globals = spec_globals }
-- swap_math: math.exp & co. explain themselves while score_mod / mask_mod are traced, then come back
files["lua/attnlab/variants/trace.lua"] = { globals = { "math" } }
