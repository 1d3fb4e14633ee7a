--[[
attnlab.variants.interval — interval arithmetic over a traced expression.

interval(root, box, caps_range) returns lo, hi with lo <= root <= hi for every point of an index box
({b = {lo, hi}, h = ..., q = ..., kv = ...}, 0-based; -inf / inf where unknown). It is exact for
comparisons of sums of indices, which is what lets block masks judge a causal or sliding-window tile
in O(1). caps_range gives each capture's value range, and for a small index box of a capture read its
exact range there (read once and cached). score_bounds(root) bounds the new logit over every input
(no capture ranges: a capture's values may change after the variant is built).
]]
local M = {}
local huge = math.huge

-- interval of a node over an index box: returns lo, hi (numbers; -inf/inf = unknown)
local function interval(root, box, caps_range)
  local memo = {}
  local function I(n)
    local m = memo[n]
    if m then return m[1], m[2] end
    local lo, hi = -huge, huge
    local op = n.op
    local a, b = n.args[1], n.args[2]
    if op == "const" then lo, hi = rawget(n, "v"), rawget(n, "v")
    elseif op == "var" then local r = box[n.x]; if r then lo, hi = r[1], r[2] end
    elseif op == "add" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = l1 + l2, h1 + h2
    elseif op == "sub" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = l1 - h2, h1 - l2
    elseif op == "neg" then local l1, h1 = I(a); lo, hi = -h1, -l1
    elseif op == "mul" then
      local l1, h1 = I(a); local l2, h2 = I(b)
      local p = { l1 * l2, l1 * h2, h1 * l2, h1 * h2 }
      lo, hi = huge, -huge
      for _, x in ipairs(p) do
        if x ~= x then lo, hi = -huge, huge break end
        if x < lo then lo = x end
        if x > hi then hi = x end
      end
    elseif op == "lt" or op == "le" or op == "gt" or op == "ge" or op == "eq" or op == "ne" then
      local l1, h1 = I(a); local l2, h2 = I(b)
      local t, f
      if op == "lt" then t, f = h1 < l2, l1 >= h2
      elseif op == "le" then t, f = h1 <= l2, l1 > h2
      elseif op == "gt" then t, f = l1 > h2, h1 <= l2
      elseif op == "ge" then t, f = l1 >= h2, h1 < l2
      elseif op == "eq" then t, f = (l1 == h1 and l2 == h2 and l1 == l2), (h1 < l2 or h2 < l1)
      else t, f = (h1 < l2 or h2 < l1), (l1 == h1 and l2 == h2 and l1 == l2) end
      if t then lo, hi = 1, 1 elseif f then lo, hi = 0, 0 else lo, hi = 0, 1 end
    elseif op == "land" or op == "lor" then
      local l1, h1 = I(a); local l2, h2 = I(b)
      -- truth: 1 = surely true (0 not in range), 0 = surely false, nil = unknown
      local function tv(l, h) if l > 0 or h < 0 then return 1 end if l == 0 and h == 0 then return 0 end return nil end
      local x, y = tv(l1, h1), tv(l2, h2)
      local r
      if op == "land" then
        if x == 0 or y == 0 then r = 0 elseif x == 1 and y == 1 then r = 1 end
      else
        if x == 1 or y == 1 then r = 1 elseif x == 0 and y == 0 then r = 0 end
      end
      if r then lo, hi = r, r else lo, hi = 0, 1 end
    elseif op == "lnot" then
      local l1, h1 = I(a)
      if l1 > 0 or h1 < 0 then lo, hi = 0, 0 elseif l1 == 0 and h1 == 0 then lo, hi = 1, 1 else lo, hi = 0, 1 end
    elseif op == "where" then
      local lc, hc = I(a)
      local l1, h1 = I(b); local l2, h2 = I(n.args[3])
      if lc > 0 or hc < 0 then lo, hi = l1, h1
      elseif lc == 0 and hc == 0 then lo, hi = l2, h2
      else lo, hi = math.min(l1, l2), math.max(h1, h2) end
    elseif op == "abs" then
      local l1, h1 = I(a)
      if l1 >= 0 then lo, hi = l1, h1 elseif h1 <= 0 then lo, hi = -h1, -l1 else lo, hi = 0, math.max(-l1, h1) end
    elseif op == "min" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = math.min(l1, l2), math.min(h1, h2)
    elseif op == "max" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = math.max(l1, l2), math.max(h1, h2)
    elseif op == "exp" then local l1, h1 = I(a); lo, hi = math.exp(l1), math.exp(h1)
    elseif op == "tanh" then local l1, h1 = I(a); lo, hi = math.tanh(l1), math.tanh(h1)
    elseif op == "load" and caps_range[n.x + 1] then   -- (a capture with no range given: unbounded)
      local r = caps_range[n.x + 1]
      lo, hi = r.lo, r.hi
      -- a small box of the capture: its exact value range there
      local box_lo, box_hi, cnt = {}, {}, 1
      for d = 1, #n.args do
        local l1, h1 = I(n.args[d])
        l1, h1 = math.max(l1, 1), math.min(h1, r.shape[d])
        if l1 > h1 or h1 - l1 > 1e6 then cnt = huge break end
        box_lo[d], box_hi[d] = l1, h1
        cnt = cnt * (h1 - l1 + 1)
      end
      if cnt <= 65536 then
        local key = n.x .. ":" .. table.concat(box_lo, ",") .. ":" .. table.concat(box_hi, ",")
        local hit = r.cache[key]
        if not hit then
          local p, st = r.ptr, r.strides
          local l2, h2 = huge, -huge
          local nd = #n.args
          local function rec(d, off)
            if d > nd then
              local x = p[off]
              if x ~= x then l2, h2 = -huge, huge elseif l2 == l2 then
                if x < l2 then l2 = x end
                if x > h2 then h2 = x end
              end
              return
            end
            for i = box_lo[d], box_hi[d] do rec(d + 1, off + (i - 1) * st[d]) end
          end
          rec(1, 0)
          hit = { l2, h2 }
          r.cache[key] = hit
        end
        lo, hi = hit[1], hit[2]
      end
    end
    if lo ~= lo or hi ~= hi then lo, hi = -huge, huge end
    memo[n] = { lo, hi }
    return lo, hi
  end
  return I(root)
end

-- score_bounds(root): lo, hi with lo <= the new logit <= hi for every input, or nil when the interval arithmetic
-- cannot bound it. The C side gets them as al_attn_variant.score_lo / score_hi: the Hopper forward then uses hi as a
-- fixed softmax max where hi - lo <= 64 (soft-capping at c: [-c, c]). No capture ranges are given, so a capture
-- read is unbounded: a capture's values are data, which may change after the variant is built.
local function score_bounds(root)
  local lo, hi = interval(root, {}, {})
  if lo > -huge and hi < huge then return lo, hi end
  return nil
end

M.interval, M.score_bounds = interval, score_bounds
return M
