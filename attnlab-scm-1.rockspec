-- attnlab-scm-1.rockspec — `luarocks make` from a checkout builds with the Makefile and installs the
-- library, header, Lua modules and launcher into the rocks tree. LuaJIT only (the front end is FFI):
-- it depends on lua == 5.1 for that reason. No rock dependencies; tests use Debian's busted (make test).
-- With Debian's luarocks (configured for another Lua):
--   luarocks --lua-version=5.1 make LUA_INCDIR=/usr/include/luajit-2.1 [--tree DIR]
-- Known gap: luarocks deploys the rock's lib/ and share/lua/ into the tree's own folders after
-- `make install`, so attnlab/config.lua (and the launcher) name the rock folder, not the deployed
-- paths; until lua/attnlab/ffi.lua also searches package.cpath for libattnlab.so, set
-- ATTNLAB_LIBDIR=<tree>/lib/lua/5.1 and ATTNLAB_HEADER=<rock dir>/include/attnlab.h.
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
