-- attnlab-scm-1.rockspec — `luarocks make` from a checkout builds with the Makefile and installs the
-- library, header, Lua modules and launcher into the rocks tree. LuaJIT only (the front end is FFI):
-- it depends on lua == 5.1 for that reason. No rock dependencies; tests use Debian's busted (make test).
-- With Debian's luarocks (configured for another Lua):
--   luarocks --lua-version=5.1 make LUA_INCDIR=/usr/include/luajit-2.1 [--tree DIR]
-- After `make install` into the rock's folder, luarocks deploys the rock: lib/ moves to <tree>/lib/lua/5.1
-- and the Lua modules (with a copy of attnlab.h) to <tree>/share/lua/5.1; include/ and share/attnlab/kernels
-- stay in the rock's folder. Nothing needs setting afterwards: attnlab/ffi.lua finds libattnlab.so through
-- package.cpath (or relative to itself), the header beside itself or through config.lua, and points the
-- CUDA plugin (which the core loads from beside libattnlab.so) at the rock's kernel sources; the launcher
-- <tree>/bin/attnlab finds the modules and library relative to itself. With the tree's paths
-- (eval "$(luarocks --lua-version=5.1 path --tree DIR)"), `luajit -e 'require "attnlab"'` works too.
-- tests/spec/install_spec.lua checks all of this (pending when luarocks is not installed).
rockspec_format = "3.0"
package = "attnlab"
version = "scm-1"
source = {
  url = "git+file://.",   -- `luarocks make` in the checkout uses the working tree
}
description = {
  summary = "A LuaJIT-scriptable research sandbox for attention (TransformerEngine's DotProductAttention semantics)",
  detailed = [[
A small C runtime (tensors, zero-copy packed QKV/KV views, the attention front door and backends: a CPU
oracle and, when nvcc is found, a CUDA plugin) driven from LuaJIT through the FFI: REPL, scripts,
busted suites and Jupyter notebooks.]],
  license = "MIT",
  labels = { "attention", "luajit", "ffi", "cuda" },
}
dependencies = {
  "lua == 5.1",
}
build = {
  type = "make",
  makefile = "Makefile",
  build_target = "all",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
  },
  install_target = "install",
  install_variables = {
    PREFIX = "$(PREFIX)",       -- library, header, launcher, pkg-config under the rock's folder
    LUADIR = "$(LUADIR)",       -- the Lua modules where the rocks tree's LUA_PATH finds them
  },
}
test = {
  type = "command",
  command = "make test",
}
