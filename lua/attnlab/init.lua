--[[
attnlab — a LuaJIT-scriptable research sandbox for attention.

  local al = require "attnlab"
  local qkv = al.randn({2, 128, 3, 16, 64})
  local q, k, v, layout = al.attention.unpack_qkv{qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd"}

The front end is split by job; each module's install(al) adds its part to the `al` table:
  tensor.lua (tensors, views, copies, cuda, memory) · math.lua · print.lua · warnings.lua ·
  layout.lua (packed QKV/KV declaration, layout strings, legacy detection) · attention.lua ·
  variants.lua (score_mod / mask_mod, block masks; its pieces in variants/) · nn.lua
The raw C namespace stays reachable as al.C, and the FFI module as al.ffi.
]]
local lffi = require "attnlab.ffi"

local al = {}
al.C = lffi.C
al.ffi = lffi.ffi
al.version = lffi.ffi.string(lffi.C.al_version())

-- Modules in dependency order. A module that is not present in this checkout is skipped; any other
-- error while loading one is raised.
local MODULES = { "attnlab.tensor", "attnlab.math", "attnlab.print", "attnlab.warnings", "attnlab.layout",
  "attnlab.attention", "attnlab.variants", "attnlab.nn", "attnlab.cp", "attnlab.layers", "attnlab.mha", "attnlab.inference", "attnlab.optim",
  "attnlab.plot", "attnlab.progress", "attnlab.results", "attnlab.fp8" }

for _, name in ipairs(MODULES) do
  local ok, mod = pcall(require, name)
  if ok then
    if type(mod) == "table" and mod.install then mod.install(al) end
  elseif not tostring(mod):find("module '" .. name .. "' not found", 1, true) then
    error(mod, 0)
  end
end

return al
