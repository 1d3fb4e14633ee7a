-- scripts/gen_api_docs.lua — writes docs/REFERENCE.md (or the file named by arg[1]): every public C
-- function in include/attnlab.h with its comment, every al.* function and tensor method with its doc
-- comment (lua/attnlab/apidoc.lua does the reading). Run by `make docs`:
--   ATTNLAB_LIBDIR=... LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit scripts/gen_api_docs.lua [out.md]
-- The output is deterministic, so tests/spec/api_docs_spec.lua regenerates it and compares.
local out = arg and arg[1] or "docs/REFERENCE.md"
local al = require "attnlab"
local apidoc = require "attnlab.apidoc"
local text = apidoc.markdown(al)
local f = assert(io.open(out, "wb"))
f:write(text)
f:close()
local lua_n, c_n = select(2, text:gsub("\n### `al", "")), select(2, text:gsub("\n#### `al_", ""))
io.stderr:write(string.format("gen_api_docs: wrote %s (%d al.* functions, %d C functions)\n", out, lua_n, c_n))
