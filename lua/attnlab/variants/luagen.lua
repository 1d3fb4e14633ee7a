--[[
attnlab.variants.luagen — Lua source from a traced expression, for the CPU oracle and block masks.

gen_lua(root, names) prints one Lua expression (booleans as 1 / 0, the math functions as the chunk's
locals m_exp, m_tanh, ...); lua_header(caps, what) starts a chunk with those locals and one
bounds-checked reader ld<k>(i1, ...) per capture (an out-of-range index raises an error naming the
capture, the dim, the index and the position b, h, q_idx, kv_idx); load_chunk(src, name) compiles a
chunk once per source text. LuaJIT's trace compiler turns the loops over the score matrix into
machine code, in double precision: the oracle's exactness and speed both come from here.
ORACLE_NAMES maps the expression's variables to the loop variables of the generated chunks.
]]
local M = {}
local huge = math.huge

local function lua_num(v)
  if v ~= v then return "(0/0)" end
  if v == huge then return "math.huge" end
  if v == -huge then return "(-math.huge)" end
  return string.format("%.17g", v)
end

local LUA_CMP = { lt = "<", le = "<=", gt = ">", ge = ">=", eq = "==", ne = "~=" }
local LUA_ARITH = { add = "+", sub = "-", mul = "*", div = "/", mod = "%" }

-- Lua source of an expression; vars map to the given local names; loads call ld<k>(i1, i2, ...)
local function gen_lua(root, names)
  local function E(n)
    local op = n.op
    if op == "const" then return lua_num(rawget(n, "v"))
    elseif op == "var" then return names[n.x]
    elseif LUA_ARITH[op] then return "(" .. E(n.args[1]) .. " " .. LUA_ARITH[op] .. " " .. E(n.args[2]) .. ")"
    elseif op == "neg" then return "(-" .. E(n.args[1]) .. ")"
    elseif op == "pow" then return "(" .. E(n.args[1]) .. " ^ " .. lua_num(tonumber(n.x)) .. ")"
    elseif LUA_CMP[op] then return "(" .. E(n.args[1]) .. " " .. LUA_CMP[op] .. " " .. E(n.args[2]) .. " and 1 or 0)"
    elseif op == "land" then return "((" .. E(n.args[1]) .. " ~= 0 and " .. E(n.args[2]) .. " ~= 0) and 1 or 0)"
    elseif op == "lor" then return "((" .. E(n.args[1]) .. " ~= 0 or " .. E(n.args[2]) .. " ~= 0) and 1 or 0)"
    elseif op == "lnot" then return "(" .. E(n.args[1]) .. " == 0 and 1 or 0)"
    elseif op == "where" then return "(" .. E(n.args[1]) .. " ~= 0 and " .. E(n.args[2]) .. " or " .. E(n.args[3]) .. ")"
    elseif op == "exp" or op == "log" or op == "tanh" or op == "sqrt" or op == "abs" then
      return "m_" .. op .. "(" .. E(n.args[1]) .. ")"
    elseif op == "min" or op == "max" then return "m_" .. op .. "(" .. E(n.args[1]) .. ", " .. E(n.args[2]) .. ")"
    elseif op == "load" then
      local parts = {}
      for i, a in ipairs(n.args) do parts[i] = E(a) end
      return "ld" .. n.x .. "(" .. table.concat(parts, ", ") .. ")"
    end
    error("variants: internal: no Lua for op " .. tostring(op))
  end
  return E(root)
end

-- the chunk header: math locals and one bounds-checked reader per capture
local function lua_header(caps, what)
  local L = { "local m_exp, m_log, m_tanh, m_sqrt, m_abs, m_min, m_max = math.exp, math.log, math.tanh, " ..
    "math.sqrt, math.abs, math.min, math.max",
    "local CAPS, POS, error, format = ...",
    "local function oob(k, d, i, n, shape) error(format(" ..
    "\"%s: captured tensor %d (shape %s) read at index %s on dim %d, outside 1..%d (at b=%d, h=%d, q_idx=%d, kv_idx=%d)\", " ..
    string.format("%q", what) .. ", k, shape, tostring(i), d, n, POS[0] + 1, POS[1] + 1, POS[2] + 1, POS[3] + 1), 0) end" }
  for _, rec in ipairs(caps) do
    local k = rec.k
    local args, checks, off = {}, {}, {}
    for d = 1, #rec.shape do
      args[d] = "i" .. d
      checks[d] = string.format("if i%d < 1 or i%d > %d or i%d %% 1 ~= 0 then oob(%d, %d, i%d, %d, %q) end",
        d, d, rec.shape[d], d, k + 1, d, d, rec.shape[d], rec.shape_str)
      off[d] = string.format("(i%d - 1) * %d", d, rec.strides[d])
    end
    L[#L + 1] = string.format("local c%d = CAPS[%d]", k, k + 1)
    L[#L + 1] = string.format("local function ld%d(%s) %s return c%d[%s] end", k, table.concat(args, ", "),
      table.concat(checks, " "), k, table.concat(off, " + "))
  end
  return table.concat(L, "\n") .. "\n"
end

local chunk_cache = setmetatable({}, { __mode = "v" })
local function load_chunk(src, name)
  local f = chunk_cache[src]
  if f then return f end
  local err
  f, err = loadstring(src, "=" .. name)
  if not f then error("variants: internal: generated Lua does not compile: " .. tostring(err) .. "\n" .. src, 0) end
  chunk_cache[src] = f
  return f
end

-- the loop variables of the oracle's and the block masks' chunks (0-based b, h, i = q_idx, j = kv_idx)
local ORACLE_NAMES = { score = "score", grad = "grad", b = "b", h = "h", q = "i", kv = "j" }

M.gen_lua, M.lua_header, M.load_chunk, M.ORACLE_NAMES = gen_lua, lua_header, load_chunk, ORACLE_NAMES
return M
