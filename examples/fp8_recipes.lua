-- examples/fp8_recipes.lua — FP8 attention under each scaling recipe (emulated exactly on the cpu
-- backend): the error against the bf16 path, each slot's last amax and scale after a few steps, and
-- whether causal outputs for a prefix stay bit-identical when the masked future tokens change (the
-- causality hazard of per-tensor current scaling, TE issue #3248). See docs/FP8.md.
--   scripts/attnlab examples/fp8_recipes.lua
local al = rawget(_G, "al") or require "attnlab"

local function lua_recipe(timing)
  return al.fp8.Recipe{ amax_history_len = 8, timing = timing,
    scale = function(slot, amaxes, fp8_max)        -- amaxes: the history, or {current amax}
      local m = 0
      for _, a in ipairs(amaxes) do m = math.max(m, a) end
      return m > 0 and fp8_max / m / 2 or 1
    end }
end

-- name, constructor (a fresh recipe each call)
local RECIPES = {
  { "DelayedScaling", function() return al.fp8.DelayedScaling{ amax_history_len = 4 } end },
  { "CurrentScaling", function() return al.fp8.CurrentScaling{} end },
  { "CurrentScaling token", function() return al.fp8.CurrentScaling{ granularity = "token" } end },
  { "MXFP8BlockScaling", function() return al.fp8.MXFP8BlockScaling{} end },
  { "MXFP8 v_block_dim=d", function() return al.fp8.MXFP8BlockScaling{ v_block_dim = "d" } end },
  { "Recipe (Lua, current)", function() return lua_recipe{ qkv = "current", o = "current", default = "delayed" } end },
}

-- RMSE / value range of out against ref (TE's bar: < 0.11)
local function rel_rmse(out, ref)
  out, ref = out:to("f64"), ref:to("f64")
  local diff = out - ref
  local function num(x) return type(x) == "number" and x or x:item() end
  return math.sqrt(num((diff * diff):mean())) / (num(ref:max()) - num(ref:min()))
end

local b, s, h, d, steps = 2, 32, 2, 32, 3
al.manual_seed(1)
local qkv = al.randn({ b, s, 3, h, d }, { dtype = "bf16" })
local dout = al.randn({ b, s, h * d }, { dtype = "bf16" })
local args = { qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal" }
local ref, rctx = al.attention.forward(args)
local rgrad = al.attention.backward(rctx, dout).qkv_layer

print(string.format("== FP8 vs bf16, b=%d s=%d h=%d d=%d causal, step %d (RMSE / range; TE's bar 0.11)", b, s, h, d, steps))
for _, rc in ipairs(RECIPES) do
  local r = rc[2]()
  local out, ctx
  for _ = 1, steps do     -- delayed slots use the previous steps' amaxes
    out, ctx = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = r }
  end
  local g = al.attention.backward(ctx, dout).qkv_layer
  print(string.format("%-22s out %.4f  dqkv %.4f", rc[1], rel_rmse(out, ref), rel_rmse(g, rgrad)))
  local st, cells = r:state(), {}
  for _, slot in ipairs(al.fp8.SLOTS) do
    local e = st[slot]
    -- last_scale: the scale the last step used (0 = one per token, nil for MXFP8 blocks)
    local sc = e.mode == "mx" and "blocks" or (e.mode == "token" or e.last_scale == 0) and "per-token"
      or string.format("%.3g", e.last_scale or e.scale)
    cells[#cells + 1] = string.format("%s %s/%s", slot, e.last_amax and string.format("%.3g", e.last_amax) or "-", sc)
  end
  print("    last amax/scale used: " .. table.concat(cells, "  "))
end

-- Prefix invariance: enlarge the last 8 tokens, compare the first s-8 outputs bit for bit, both runs
-- starting from the same (warmed) recipe state.
print(string.format("== causal prefix-invariance (last 8 of %d tokens changed and x1000)", s))
al.manual_seed(2)
local q1 = al.randn({ 1, s, 3, h, d })
local q2 = q1:clone()
q2:narrow(2, s - 7, 8):copy_(al.randn({ 1, 8, 3, h, d }) * 1000)
for _, rc in ipairs(RECIPES) do
  local r = rc[2]()
  al.attention.forward{ qkv_layer = q1, qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = r }
  local r1, r2 = r:clone(), r:clone()
  local o1 = al.attention.forward{ qkv_layer = q1, qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = r1 }
  local o2 = al.attention.forward{ qkv_layer = q2, qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = r2 }
  local dmax = al.max_abs_diff(o1:narrow(2, 1, s - 8), o2:narrow(2, 1, s - 8))
  print(string.format("%-22s %s  (max |diff| %.3g)", rc[1], dmax == 0 and "yes" or "no ", dmax))
end
