--[[
attnlab.variants.block_mask — al.attention.block_mask(mask_mod, B, H, Sq, Skv, {block = 128}): the tile
map that lets the flash kernels skip empty tiles and the mask test in full ones.

Every block_m x block_n tile is 0 (every element masked), 1 (partial) or 2 (every element kept). A tile
is first judged by interval arithmetic over its index box (attnlab.variants.interval; exact for
comparisons of sums of indices, so causal and sliding-window masks cost O(tiles)); tiles the intervals
cannot decide are evaluated element by element with generated Lua, stopping as soon as the tile is
known to be partial. The map broadcasts over b and h (size 1) when mask_mod does not read them.
]]
local lffi = require "attnlab.ffi"
local variant = require "attnlab.variants.variant"
local luagen = require "attnlab.variants.luagen"
local interval = require("attnlab.variants.interval").interval

local M = {}
local ffi = lffi.ffi
local huge = math.huge
local build, uses_var = variant.build, variant.uses_var
local gen_lua, lua_header, load_chunk, NAMES = luagen.gen_lua, luagen.lua_header, luagen.load_chunk, luagen.ORACLE_NAMES

local BlockMask = {}
BlockMask.__index = BlockMask
M.BlockMask = BlockMask

function BlockMask:sparsity() return self.counts[0] / math.max(self.ntiles, 1) end
function BlockMask:__tostring()
  local n = math.max(self.ntiles, 1)
  local s = string.format("BlockMask(B=%d%s, H=%d%s, Sq=%d, Skv=%d, block=%dx%d): %d x %d tiles, " ..
    "%.1f%% empty (skipped), %.1f%% partial, %.1f%% full",
    self.B, self.bb == 1 and self.B ~= 1 and " broadcast" or "", self.H, self.hb == 1 and self.H ~= 1 and " broadcast" or "",
    self.Sq, self.Skv, self.block_m, self.block_n, self.nm, self.nn,
    100 * self.counts[0] / n, 100 * self.counts[1] / n, 100 * self.counts[2] / n)
  if self.nm <= 16 and self.nn <= 32 then
    local ch = { [0] = ".", "+", "#" }
    local p = ffi.cast("uint8_t *", self.mask:data_ptr())
    local lines = { s, "  (b=1, h=1; # full, + partial, . empty)" }
    for i = 0, self.nm - 1 do
      local row = {}
      for j = 0, self.nn - 1 do row[#row + 1] = ch[p[i * self.nn + j]] end
      lines[#lines + 1] = "  " .. table.concat(row)
    end
    return table.concat(lines, "\n")
  end
  return s
end
-- the mask tensor on a device (cached per device)
function BlockMask:on(device)
  if device == "cpu" then return self.mask end
  self._dev = self._dev or {}
  local t = self._dev[device]
  if not t then t = self.mask:to(device) self._dev[device] = t end
  return t
end

local function check_pos_int(fname, name, v)
  if type(v) ~= "number" or v % 1 ~= 0 or v < 1 then
    error(string.format("%s: %s: expected a positive integer, got %s", fname, name, tostring(v)), 3)
  end
end

function M.block_mask(al, mask_mod, B, H, Sq, Skv, opts)
  local fname = "attention.block_mask"
  if type(mask_mod) ~= "function" then error(fname .. ": mask_mod: expected a function(b, h, q_idx, kv_idx), got " .. type(mask_mod), 2) end
  check_pos_int(fname, "B", B)
  check_pos_int(fname, "H", H)
  check_pos_int(fname, "Sq", Sq)
  check_pos_int(fname, "Skv", Skv)
  opts = opts or {}
  if type(opts) ~= "table" then error(fname .. ": opts: expected a table {block=, block_m=, block_n=}, got " .. type(opts), 2) end
  local bm = opts.block_m or opts.block or 128
  local bn = opts.block_n or opts.block or 128
  check_pos_int(fname, "block_m", bm)
  check_pos_int(fname, "block_n", bn)
  local ok, v = pcall(build, al, nil, mask_mod, fname)
  if not ok then error(v, 2) end
  local root = v.mask_root
  local bb = uses_var(root, "b") and B or 1
  local hb = uses_var(root, "h") and H or 1
  local nm, nn = math.ceil(Sq / bm), math.ceil(Skv / bn)
  local mask = al.zeros({ bb, hb, nm, nn }, { dtype = "u8" })
  local mp = ffi.cast("uint8_t *", mask:data_ptr())
  -- capture value ranges (for the intervals)
  local ranges = {}
  v:_bind_cpu(al)
  for i, rec in ipairs(v.captures) do
    local p = v.cpu_caps_ptrs[i]
    local lo, hi = huge, -huge
    for e = 0, rec.numel - 1 do
      local x = p[e]
      if x ~= x then lo, hi = -huge, huge break end
      if x < lo then lo = x end
      if x > hi then hi = x end
    end
    ranges[i] = { lo = lo, hi = hi, ptr = p, strides = rec.strides, shape = rec.shape, cache = {} }
  end
  -- brute force of one tile (early exit once partial)
  local mexpr = gen_lua(root, NAMES)
  local src = lua_header(v.captures, "mask_mod") .. [[
return function(b, h, i0, i1, j0, j1)
  POS[0], POS[1] = b, h
  local seen_keep, seen_drop = false, false
  for i = i0, i1 do
    POS[2] = i
    for j = j0, j1 do
      POS[3] = j
      if (]] .. mexpr .. [[) ~= 0 then seen_keep = true else seen_drop = true end
      if seen_keep and seen_drop then return 1 end
    end
  end
  return seen_keep and 2 or 0
end
]]
  local tile_fn = load_chunk(src, "block_mask")(v.cpu_caps_ptrs, v.pos, error, string.format)
  local counts = { [0] = 0, 0, 0 }
  local row_work = {}                        -- non-empty tiles per query block, over b and h
  for ti = 0, nm - 1 do row_work[ti] = 0 end
  local box = { b = { 0, 0 }, h = { 0, 0 }, q = { 0, 0 }, kv = { 0, 0 } }
  local brute = 0
  for b = 0, bb - 1 do
    box.b[1], box.b[2] = b, b
    for h = 0, hb - 1 do
      box.h[1], box.h[2] = h, h
      for ti = 0, nm - 1 do
        local i0, i1 = ti * bm, math.min(Sq, (ti + 1) * bm) - 1
        box.q[1], box.q[2] = i0, i1
        for tj = 0, nn - 1 do
          local j0, j1 = tj * bn, math.min(Skv, (tj + 1) * bn) - 1
          box.kv[1], box.kv[2] = j0, j1
          local lo, hi = interval(root, box, ranges)
          local cls
          if lo > 0 or hi < 0 then cls = 2
          elseif lo == 0 and hi == 0 then cls = 0
          else
            cls = tile_fn(b, h, i0, i1, j0, j1)
            brute = brute + 1
          end
          mp[((b * hb + h) * nm + ti) * nn + tj] = cls
          counts[cls] = counts[cls] + 1
          if cls ~= 0 then row_work[ti] = row_work[ti] + 1 end
        end
      end
    end
  end
  -- heavy_last: later query blocks hold more non-empty tiles (work correlates positively with the block index,
  -- as for causal and prefix-LM masks); the flash forward then launches the query blocks last first
  local tilt = 0
  for ti = 0, nm - 1 do tilt = tilt + (ti - (nm - 1) / 2) * row_work[ti] end
  return setmetatable({ mask = mask, block_m = bm, block_n = bn, B = B, H = H, Sq = Sq, Skv = Skv, bb = bb, hb = hb,
    nm = nm, nn = nn, counts = counts, ntiles = bb * hb * nm * nn, brute_tiles = brute, mask_mod = mask_mod,
    heavy_last = tilt > 0 }, BlockMask)
end

function M.is_block_mask(x) return type(x) == "table" and getmetatable(x) == BlockMask end


function M.check_block_mask(fname, bm, B, H, SQ, SKV)
  if not M.is_block_mask(bm) then
    error(fname .. ": block_mask: expected the result of al.attention.block_mask, got " .. type(bm), 0)
  end
  if (bm.bb ~= 1 and bm.B ~= B) or (bm.hb ~= 1 and bm.H ~= H) or bm.Sq ~= SQ or bm.Skv ~= SKV then
    error(string.format("%s: block_mask: built for B=%d, H=%d, Sq=%d, Skv=%d, but the call has B=%d, H=%d, Sq=%d, Skv=%d",
      fname, bm.B, bm.H, bm.Sq, bm.Skv, B, H, SQ, SKV), 0)
  end
end

return M
