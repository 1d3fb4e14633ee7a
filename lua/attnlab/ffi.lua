--[[
attnlab.ffi — loads the C library once and declares its API to LuaJIT's FFI.

The declarations are generated from include/attnlab.h: the block between AL_FFI_BEGIN and AL_FFI_END
is passed to ffi.cdef as is (the header keeps that block free of macros). In the repository the
header and lib/ are found relative to this file (ATTNLAB_LIBDIR overrides the library folder); after
`make install`, attnlab/config.lua names them.

Returns { C = the library namespace, ffi = ffi }.
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

local root = this_dir() .. "/../.."
local ok_cfg, cfg = pcall(require, "attnlab.config")
if not ok_cfg then cfg = nil end

local header = os.getenv("ATTNLAB_HEADER")
  or (exists(root .. "/include/attnlab.h") and root .. "/include/attnlab.h")
  or (cfg and cfg.header)
local libdir = os.getenv("ATTNLAB_LIBDIR")
  or (exists(root .. "/lib/libattnlab.so") and root .. "/lib")
  or (cfg and cfg.libdir)

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

-- Last resort before the system's library path: package.cpath (where luarocks puts the library).
local libpath = libdir and (libdir .. "/libattnlab.so")
  or (package.searchpath and package.searchpath("libattnlab", package.cpath))
  or "attnlab"
local ok, C = pcall(ffi.load, libpath)
if not ok then
  error("attnlab: cannot load " .. libpath .. " (" .. tostring(C) .. "); run `make` first or set ATTNLAB_LIBDIR", 2)
end

return { C = C, ffi = ffi, libdir = libdir, header = header }
