--[[
attnlab.ffi — loads the C library once and declares its API to LuaJIT's FFI.

The declarations are generated from include/attnlab.h: the block between AL_FFI_BEGIN and AL_FFI_END
is passed to ffi.cdef as is (the header keeps that block free of macros).

Where things are found (first hit wins), so that a checkout, `make install` and a luarocks tree all
work without environment variables:
  header          $ATTNLAB_HEADER; the repository's include/ (relative to this file); attnlab/config.lua's
                  header (written by `make install`); attnlab/attnlab.h beside this file (installed
                  with the modules, so it moves with them when luarocks deploys the rock).
  libattnlab.so   $ATTNLAB_LIBDIR; the repository's lib/; config.lua's libdir; package.cpath
                  (package.searchpath: where luarocks deploys it, <tree>/lib/lua/5.1); the prefix this
                  file is installed under (<prefix>/share/lua/5.1/attnlab -> <prefix>/lib and
                  <prefix>/lib/lua/5.1); last, the system's library path.
The CUDA plugin (libattnlab_cuda.so) is found by the core beside libattnlab.so (src/cuda_loader.c), so it
moves with it. The NVRTC kernel sources: the plugin looks in $ATTNLAB_KERNEL_DIR, then beside its own
folder (../share/attnlab/kernels); when it would not find them there (a luarocks tree leaves them in the
rock's folder) and config.lua names a folder that has them, ATTNLAB_KERNEL_DIR is set to it here.

Returns { C = the library namespace, ffi = ffi, libdir, libpath, header, kernel_dir }.
]]
local ffi = require "ffi"

local function this_dir()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) ~= "@" then return "." end
  return src:sub(2):match("^(.*)/[^/]*$") or "."
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local here = this_dir()
local root = here .. "/../.."
local ok_cfg, cfg = pcall(require, "attnlab.config")
if not ok_cfg or type(cfg) ~= "table" then cfg = {} end
-- <prefix>/share/lua/5.1/attnlab -> <prefix> (make install and luarocks trees share this layout)
local prefix = here:match("^(.*)/share/lua/5%.1/attnlab$")

local function first_file(...)
  for i = 1, select("#", ...) do
    local p = select(i, ...)
    if p and exists(p) then return p end
  end
  return nil
end

-- an environment variable, unless unset or empty
local function env(name)
  local v = os.getenv(name)
  if v == "" then return nil end
  return v
end

local header = env("ATTNLAB_HEADER")
  or first_file(root .. "/include/attnlab.h", cfg.header, here .. "/attnlab.h")

local libpath
if env("ATTNLAB_LIBDIR") then
  libpath = env("ATTNLAB_LIBDIR") .. "/libattnlab.so"
else
  libpath = first_file(root .. "/lib/libattnlab.so", cfg.libdir and (cfg.libdir .. "/libattnlab.so"),
      package.searchpath and package.searchpath("libattnlab", package.cpath),
      prefix and (prefix .. "/lib/libattnlab.so"), prefix and (prefix .. "/lib/lua/5.1/libattnlab.so"))
end
local libdir = libpath and (libpath:match("^(.*)/[^/]*$") or ".")

if not header or not exists(header) then
  error("attnlab: cannot find include/attnlab.h (set ATTNLAB_HEADER)", 2)
end

-- Declare once per process (a REPL may reload modules; re-declaring a struct is an error).
if not pcall(ffi.typeof, "al_tensor") then
  local f = assert(io.open(header, "rb"))
  local text = f:read("*a")
  f:close()
  local block = text:match("/%* AL_FFI_BEGIN %*/(.-)/%* AL_FFI_END %*/")
  if not block then error("attnlab: " .. header .. " has no AL_FFI_BEGIN/AL_FFI_END block", 2) end
  ffi.cdef(block)
  -- The Lua handle: a wrapper struct, so that method names (size, stride, dtype) never collide with
  -- the descriptor's field names. Released through C by the metatype's __gc (see tensor.lua).
  ffi.cdef [[ typedef struct al_lua_tensor { al_tensor raw; } al_lua_tensor; ]]
end

-- Not found anywhere: the system's library path (ldconfig, LD_LIBRARY_PATH).
local ok, C = pcall(ffi.load, libpath or "attnlab")
if not ok then
  error("attnlab: cannot load " .. (libpath or "libattnlab.so") .. " (" .. tostring(C)
    .. "); run `make` first or set ATTNLAB_LIBDIR", 2)
end

-- The kernel sources for the CUDA plugin's NVRTC compiles (see the header comment).
local kernel_dir = env("ATTNLAB_KERNEL_DIR")
if kernel_dir == nil and libdir then
  local function has_kernels(d) return d and exists(d .. "/flash_common.cuh") end
  if has_kernels(libdir .. "/../kernels") or has_kernels(libdir .. "/../share/attnlab/kernels") then
    kernel_dir = nil   -- the plugin finds them itself
  elseif has_kernels(cfg.kernel_dir) then
    kernel_dir = cfg.kernel_dir
    pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
    ffi.C.setenv("ATTNLAB_KERNEL_DIR", kernel_dir, 0)
  else
    kernel_dir = nil
  end
end

return { C = C, ffi = ffi, libdir = libdir, libpath = libpath, header = header, kernel_dir = kernel_dir }
