-- install_spec.lua — what a user gets from `make install` and from `luarocks make` works on its own:
--   1. `make install PREFIX=<tmp> DESTDIR=` installs the files; the installed launcher, run from another
--      directory with a clean environment (no ATTNLAB_*, no LUA_PATH/LUA_CPATH), evaluates a one-liner
--      with the installed library and header (not the checkout's);
--   2. the same prefix moved elsewhere (config.lua now names paths that are gone) still works, through
--      the launcher and through plain `luajit -e 'require "attnlab"'`, and the core finds a CUDA plugin
--      beside the moved libattnlab.so (a stand-in plugin, when no real one was built);
--   3. with luarocks installed: `luarocks --lua-version=5.1 make --tree <tmp>` deploys the rock (lib/ into
--      <tree>/lib/lua/5.1, the modules into <tree>/share/lua/5.1); the deployed launcher and
--      `luajit -e 'require "attnlab"'` with the tree's `luarocks path` work with no ATTNLAB_* variables.
--      Pending (with the reason) when luarocks is absent.
-- The build is reused: O is the folder above $ATTNLAB_LIBDIR (make test sets it), so `make install`
-- only copies; NVCC= is passed when that build has no CUDA plugin, so nothing starts compiling one.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
if root:sub(1, 1) ~= "/" then root = os.getenv("PWD") .. "/" .. root end

package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local q, sh = shell.q, shell.sh

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function have(cmd) return select(2, sh("command -v " .. cmd .. " >/dev/null")) == 0 end

-- The build folder to reuse (O=...): the one above $ATTNLAB_LIBDIR, else the checkout itself.
local function build_dir()
  local libdir = os.getenv("ATTNLAB_LIBDIR")
  if libdir and libdir ~= "" then
    if libdir:sub(1, 1) ~= "/" then libdir = os.getenv("PWD") .. "/" .. libdir end
    local o = libdir:match("^(.*)/lib/?$")
    if o and exists(libdir .. "/libattnlab.so") then return o, libdir end
    return nil, "ATTNLAB_LIBDIR=" .. libdir .. " is not an O=DIR build's lib/ folder with libattnlab.so"
  end
  if exists(root .. "/lib/libattnlab.so") then return root, root .. "/lib" end
  return nil, "no built library: run through `make test` or set ATTNLAB_LIBDIR=<O>/lib after `make O=<O>`"
end

local O, LIBDIR_OR_WHY = build_dir()
-- the variables a build step must not inherit (a parent make's jobserver, the checkout's paths)
local BUILD_ENV = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u ATTNLAB_LIBDIR -u ATTNLAB_HEADER -u LUA_PATH -u LUA_CPATH"
local function make_vars()
  local v = "O=" .. q(O)
  if not exists(LIBDIR_OR_WHY .. "/libattnlab_cuda.so") then v = v .. " NVCC=" end
  return v
end

-- a clean environment for running what was installed: PATH (for luajit), a scratch HOME, and the
-- system's library search (LD_LIBRARY_PATH, where a GPU host's CUDA/cuDNN libraries may be) only
local function clean_env(home, extra)
  local ld = os.getenv("LD_LIBRARY_PATH")
  return "env -i PATH=" .. q(os.getenv("PATH") or "/usr/bin:/bin") .. " HOME=" .. q(home) .. " "
    .. (ld and ("LD_LIBRARY_PATH=" .. q(ld) .. " ") or "") .. (extra and (extra .. " ") or "")
end

-- the CUDA state line shows the core looked for the plugin beside `libdir` (not in the build folder):
-- absent there, the reason names that path; present, it loaded (or failed for a reason of its own)
local function assert_plugin_beside(cuda, libdir)
  assert.falsy(cuda:find(LIBDIR_OR_WHY .. "/libattnlab_cuda.so", 1, true), cuda)
  if not exists(libdir .. "/libattnlab_cuda.so") then
    assert.truthy(cuda:find(libdir .. "/libattnlab_cuda.so", 1, true), cuda)
  else
    assert.truthy(cuda:match("^true") or cuda:find(libdir .. "/libattnlab_cuda.so", 1, true)
      or not cuda:find("not loaded", 1, true), cuda)
  end
end

-- the one-liner: the sum, then the library and header the FFI picked, then the CUDA plugin's state
local PROBE = 'print("sum=" .. al.ones(2):sum():item()); local f = require "attnlab.ffi"; '
  .. 'print("libpath=" .. tostring(f.libpath)); print("header=" .. tostring(f.header)); '
  .. 'print("kernel_dir=" .. tostring(os.getenv("ATTNLAB_KERNEL_DIR"))); '
  .. 'local ok, why = al.cuda.available(); print("cuda=" .. tostring(ok) .. " " .. tostring(why))'

local function field(out, name) return out:match(name .. "=([^\n]*)") end

describe("install", function()
  local tmp = os.tmpname()
  os.remove(tmp)
  assert(os.execute("mkdir -p " .. q(tmp .. "/elsewhere")) == 0)
  teardown(function() os.execute("rm -rf " .. q(tmp)) end)
  local prefix, moved = tmp .. "/prefix", tmp .. "/moved"

  describe("make install PREFIX=<tmp>", function()
    local out, rc
    setup(function()
      if O then
        out, rc = sh(BUILD_ENV .. " make -C " .. q(root) .. " --no-print-directory " .. make_vars()
          .. " install PREFIX=" .. q(prefix) .. " DESTDIR=")
      end
    end)

    it("installs the library, header, modules, kernel sources, launcher and pkg-config file", function()
      if not O then pending(LIBDIR_OR_WHY) return end
      assert(rc == 0, "make install failed (exit " .. tostring(rc) .. "):\n" .. out)
      for _, f in ipairs({ "bin/attnlab", "lib/libattnlab.so", "include/attnlab.h", "lib/pkgconfig/attnlab.pc",
        "share/lua/5.1/attnlab/init.lua", "share/lua/5.1/attnlab/ffi.lua", "share/lua/5.1/attnlab/repl.lua",
        "share/lua/5.1/attnlab/config.lua", "share/lua/5.1/attnlab/attnlab.h",
        "share/lua/5.1/attnlab/variants/variant.lua", "share/attnlab/kernels/flash_common.cuh" }) do
        assert(exists(prefix .. "/" .. f), "missing after make install: " .. f)
      end
      local cfg = dofile(prefix .. "/share/lua/5.1/attnlab/config.lua")
      assert.equals(prefix .. "/lib", cfg.libdir)
      assert.equals(prefix .. "/include/attnlab.h", cfg.header)
      assert.equals(prefix .. "/share/attnlab/kernels", cfg.kernel_dir)
    end)

    it("the installed launcher runs a one-liner from another folder with a clean environment", function()
      if not O then pending(LIBDIR_OR_WHY) return end
      assert(rc == 0, "make install failed")
      local res, code = sh("cd " .. q(tmp .. "/elsewhere") .. " && " .. clean_env(tmp) .. q(prefix .. "/bin/attnlab")
        .. " -e " .. q(PROBE))
      assert(code == 0, "installed launcher failed (exit " .. tostring(code) .. "):\n" .. res)
      assert.equals("2", field(res, "sum"), res)
      assert.equals(prefix .. "/lib/libattnlab.so", field(res, "libpath"))
      assert.equals(prefix .. "/include/attnlab.h", field(res, "header"))
      -- the plugin's own search (../share/attnlab/kernels beside lib/) suffices: nothing is set
      assert.equals("nil", field(res, "kernel_dir"))
      -- the core looks for the CUDA plugin beside the installed library, not in the checkout
      assert_plugin_beside(field(res, "cuda"), prefix .. "/lib")
    end)

    it("a moved prefix still works (launcher, plain luajit) and finds the CUDA plugin beside the library", function()
      if not O then pending(LIBDIR_OR_WHY) return end
      assert(rc == 0, "make install failed")
      assert(os.execute("mv " .. q(prefix) .. " " .. q(moved)) == 0)
      local fake = not exists(moved .. "/lib/libattnlab_cuda.so") and have("cc")
      if fake then
        -- a stand-in plugin: says it was loaded, then refuses (the core reports CUDA unavailable)
        local c = tmp .. "/fake_plugin.c"
        local f = assert(io.open(c, "w"))
        f:write('#include <stdio.h>\nint al_cuda_plugin_init(void *api, int abi) {\n'
          .. '    (void)api; fprintf(stderr, "fake CUDA plugin loaded (abi %d)\\n", abi); return -3;\n}\n')
        f:close()
        local o, code = sh("cc -shared -fPIC -o " .. q(moved .. "/lib/libattnlab_cuda.so") .. " " .. q(c))
        assert(code == 0, o)
      end
      local res, code = sh("cd " .. q(tmp .. "/elsewhere") .. " && " .. clean_env(tmp) .. q(moved .. "/bin/attnlab")
        .. " -e " .. q(PROBE))
      assert(code == 0, "moved launcher failed (exit " .. tostring(code) .. "):\n" .. res)
      assert.equals("2", field(res, "sum"), res)
      assert.equals(moved .. "/lib/libattnlab.so", field(res, "libpath"))
      assert.equals(moved .. "/share/lua/5.1/attnlab/attnlab.h", field(res, "header"))
      if fake then assert.truthy(res:find("fake CUDA plugin loaded (abi 1)", 1, true), res) end
      assert_plugin_beside(field(res, "cuda"), moved .. "/lib")
      -- plain luajit with only the modules on LUA_PATH: the library is found relative to them
      local lp = moved .. "/share/lua/5.1/?.lua;" .. moved .. "/share/lua/5.1/?/init.lua;;"
      res, code = sh("cd " .. q(tmp .. "/elsewhere") .. " && " .. clean_env(tmp, "LUA_PATH=" .. q(lp))
        .. "luajit -e " .. q('local al = require "attnlab"; print(al.ones(3):sum():item(), require("attnlab.ffi").libpath)'))
      assert(code == 0, "luajit -e require failed (exit " .. tostring(code) .. "):\n" .. res)
      assert.truthy(res:find("3\t" .. moved .. "/lib/libattnlab.so\n", 1, true), res)
    end)
  end)

  describe("luarocks make --tree <tmp>", function()
    local tree = tmp .. "/tree"
    local missing = not have("luarocks") and "luarocks is not installed (apt-get install luarocks)" or nil
    local out, rc, rockdir
    setup(function()
      if O and not missing then
        out, rc = sh("cd " .. q(root) .. " && " .. BUILD_ENV .. " HOME=" .. q(tmp) .. " " .. make_vars()
          .. " luarocks --lua-version=5.1 make --tree " .. q(tree) .. " LUA_INCDIR=/usr/include/luajit-2.1")
        local p = io.popen("ls -d " .. q(tree) .. "/lib/luarocks/rocks-5.1/attnlab/*/ 2>/dev/null")
        rockdir = (p:read("*l") or ""):gsub("/$", "")
        p:close()
      end
    end)

    it("deploys the rock: library into lib/lua/5.1, modules into share/lua/5.1, launcher into bin", function()
      if not O then pending(LIBDIR_OR_WHY) return end
      if missing then pending(missing) return end
      assert(rc == 0, "luarocks make failed (exit " .. tostring(rc) .. "):\n" .. out)
      for _, f in ipairs({ "bin/attnlab", "lib/lua/5.1/libattnlab.so", "share/lua/5.1/attnlab/init.lua",
        "share/lua/5.1/attnlab/attnlab.h", "share/lua/5.1/attnlab/config.lua" }) do
        assert(exists(tree .. "/" .. f), "missing after luarocks make: " .. f)
      end
      assert(rockdir ~= "" and exists(rockdir .. "/share/attnlab/kernels/flash_common.cuh"), "no kernels in the rock folder")
      -- the gap this closes: config.lua's libdir is the rock folder's lib/, emptied by the deployment
      local cfg = dofile(tree .. "/share/lua/5.1/attnlab/config.lua")
      assert.is_false(exists(cfg.libdir .. "/libattnlab.so"))
    end)

    it("the deployed launcher works with a clean environment", function()
      if not O then pending(LIBDIR_OR_WHY) return end
      if missing then pending(missing) return end
      assert(rc == 0, "luarocks make failed")
      local res, code = sh("cd " .. q(tmp .. "/elsewhere") .. " && " .. clean_env(tmp) .. q(tree .. "/bin/attnlab")
        .. " -e " .. q(PROBE))
      assert(code == 0, "deployed launcher failed (exit " .. tostring(code) .. "):\n" .. res)
      assert.equals("2", field(res, "sum"), res)
      assert.equals(tree .. "/lib/lua/5.1/libattnlab.so", field(res, "libpath"))
      assert.truthy(exists(field(res, "header")), res)
      -- the plugin would not find the kernel sources beside lib/lua/5.1: the FFI points it at the rock's
      assert.equals(rockdir .. "/share/attnlab/kernels", field(res, "kernel_dir"))
      assert_plugin_beside(field(res, "cuda"), tree .. "/lib/lua/5.1")
    end)

    it("luajit -e 'require \"attnlab\"' works with the tree's `luarocks path`", function()
      if not O then pending(LIBDIR_OR_WHY) return end
      if missing then pending(missing) return end
      assert(rc == 0, "luarocks make failed")
      local paths, code = sh("HOME=" .. q(tmp) .. " luarocks --lua-version=5.1 path --tree " .. q(tree))
      assert(code == 0, paths)
      local lp = paths:match("LUA_PATH='([^']*)'")
      local lcp = paths:match("LUA_CPATH='([^']*)'")
      assert(lp and lcp, "unexpected `luarocks path` output:\n" .. paths)
      local res
      res, code = sh("cd " .. q(tmp .. "/elsewhere") .. " && " .. clean_env(tmp, "LUA_PATH=" .. q(lp) .. " LUA_CPATH=" .. q(lcp))
        .. "luajit -e " .. q('local al = require "attnlab"; print(al.ones(3):sum():item(), require("attnlab.ffi").libpath)'))
      assert(code == 0, "luajit -e require failed (exit " .. tostring(code) .. "):\n" .. res)
      assert.truthy(res:find("3\t" .. tree .. "/lib/lua/5.1/libattnlab.so\n", 1, true), res)
    end)
  end)
end)
