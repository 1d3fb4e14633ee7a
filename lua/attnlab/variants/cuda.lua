--[[
attnlab.variants.cuda — CUDA C from a traced expression: the snippets the flash kernels' hooks
(kernels/flash_common.cuh) are compiled with through NVRTC, and the prelude of helpers they need.

gen_cuda(root, caps, uses[, pre]) prints one C expression. The hooks' contract: b, h, q_idx, kv_idx are
0-based ints (so the Lua index h is (h + 1), which folds away in offsets), score and grad floats; ints
stay ints, / is always float division (by a constant: times its reciprocal; else __fdividef, 2 ulp), math is
expf / logf / sqrtf / fabsf / fminf / fmaxf and al_v_tanh (bf16 kernels: tanh.approx.f32, relative error 2^-11;
f16 kernels: exp2 + reciprocal, absolute error < 1e-6), captures are read as ((const float *)AL_CAP(k))[offset]
(int for integer captures) with the strides as constants.
`uses` collects which helpers the prelude must define (mod, iabs, iminmax, tanh) and whether the
expression holds a multi-function-unit op (mufu). cuda_prelude(uses) returns those helpers and the
build switches of ATTNLAB_VARIANT_DEFINES, or nil.
]]
local sym = require "attnlab.variants.sym"

local M = {}
local huge = math.huge
local cval, load_offset = sym.cval, sym.load_offset

local function cuda_float(v)
  if v ~= v then return "__int_as_float(0x7fffffff)" end
  if v == huge then return "__int_as_float(0x7f800000)" end
  if v == -huge then return "__int_as_float(0xff800000)" end
  local s = string.format("%.9g", v)
  if not s:find("[%.eEn]") then s = s .. ".0" end
  return s .. "f"
end

local CUDA_VARS = { score = "score", grad = "grad", b = "b", h = "h", q = "q_idx", kv = "kv_idx" }
local C_CMP = { lt = "<", le = "<=", gt = ">", ge = ">=", eq = "==", ne = "!=" }
local C_ARITH = { add = "+", sub = "-", mul = "*" }
-- tanh is al_v_tanh (the prelude): libdevice's tanhf costs ~20 instructions and two MUFU ops per score,
-- which made soft-capping 3.4x the plain forward on the H200; al_v_tanh is one tanh.approx in bf16 kernels
-- and exp2 + reciprocal in f16 ones (cuda_prelude says why)
local C_FN = { exp = "expf", log = "logf", tanh = "al_v_tanh", sqrt = "sqrtf" }

-- a constant whose reciprocal and products stay normal f32 numbers (safe to fold into a multiplier)
local function foldable(c) return c ~= nil and c == c and math.abs(c) >= 2 ^ -126 and math.abs(c) <= 2 ^ 126 end

-- gen_cuda(root, caps, uses[, pre]): the CUDA C expression of a traced tree. pre: the AL_SCORE_PRE form
-- (kernels/flash_common.cuh), where score is acc * scale and a constant factor on score folds into
-- scale: score / c becomes acc * (scale * (1/c)), one FMUL per element once the compiler hoists
-- scale * (1/c) out of the kernel's loops (it may not reassociate (acc * scale) * (1/c) itself).
local function gen_cuda(root, caps, uses, pre)
  local E
  local function is_score(n) return n.op == "var" and n.x == "score" end
  -- pre: score times constant k as acc * (scale * k)
  local function scaled_score(k) return "(acc * (scale * " .. cuda_float(k) .. "))" end
  -- as a float: constants as float literals, int expressions cast
  local function EF(n)
    if n.t == "f" then return E(n) end
    local c = cval(n)
    if c then return cuda_float(c) end
    return "(float)" .. E(n)
  end
  function E(n)
    local op = n.op
    if op == "const" then
      local v = rawget(n, "v")
      if n.t == "f" then return cuda_float(v) end
      return string.format("%d", v)
    elseif op == "var" then
      if pre and n.x == "score" then return "(acc * scale)" end
      return CUDA_VARS[n.x]
    elseif pre and op == "mul" and (is_score(n.args[1]) or is_score(n.args[2])) and
        foldable(cval(n.args[1]) or cval(n.args[2])) then
      return scaled_score(cval(n.args[1]) or cval(n.args[2]))
    elseif pre and op == "div" and is_score(n.args[1]) and foldable(cval(n.args[2])) then
      return scaled_score(1 / cval(n.args[2]))
    elseif C_ARITH[op] then
      return "(" .. E(n.args[1]) .. " " .. C_ARITH[op] .. " " .. E(n.args[2]) .. ")"
    elseif op == "neg" then return "(-" .. E(n.args[1]) .. ")"
    elseif op == "div" then
      -- by a constant: times its reciprocal (one FMUL, <= 1.5 ulp); otherwise __fdividef (2 ulp, no
      -- slow path). IEEE division is ~10 instructions with a branch, per score element.
      -- (only where c and 1/c are normal f32 numbers: 2^-126 <= |c| <= 2^126, else __fdividef)
      local c = cval(n.args[2])
      if foldable(c) then
        return "(" .. EF(n.args[1]) .. " * " .. cuda_float(1 / c) .. ")"
      end
      return "__fdividef(" .. EF(n.args[1]) .. ", " .. EF(n.args[2]) .. ")"
    elseif op == "pow" then return "powf(" .. EF(n.args[1]) .. ", " .. cuda_float(tonumber(n.x)) .. ")"
    elseif op == "mod" then
      uses.mod = true
      return (n.t == "f" and "al_v_fmod(" or "al_v_imod(") .. E(n.args[1]) .. ", " .. E(n.args[2]) .. ")"
    elseif C_CMP[op] then return "(" .. E(n.args[1]) .. " " .. C_CMP[op] .. " " .. E(n.args[2]) .. ")"
    elseif op == "land" then return "(" .. E(n.args[1]) .. " && " .. E(n.args[2]) .. ")"
    elseif op == "lor" then return "(" .. E(n.args[1]) .. " || " .. E(n.args[2]) .. ")"
    elseif op == "lnot" then return "(!" .. E(n.args[1]) .. ")"
    elseif op == "where" then
      local a, b = n.args[2], n.args[3]
      local sa, sb = E(a), E(b)
      if n.t == "f" then sa, sb = EF(a), EF(b) end
      return "(" .. E(n.args[1]) .. " ? " .. sa .. " : " .. sb .. ")"
    elseif C_FN[op] then
      if op == "tanh" then uses.tanh = true end
      uses.mufu = true
      return C_FN[op] .. "(" .. EF(n.args[1]) .. ")"
    elseif op == "abs" then
      if n.t == "f" then return "fabsf(" .. E(n.args[1]) .. ")" end
      uses.iabs = true
      return "al_v_iabs(" .. E(n.args[1]) .. ")"
    elseif op == "min" or op == "max" then
      if n.t == "f" then return (op == "min" and "fminf(" or "fmaxf(") .. EF(n.args[1]) .. ", " .. EF(n.args[2]) .. ")" end
      uses.iminmax = true
      return "al_v_i" .. op .. "(" .. E(n.args[1]) .. ", " .. E(n.args[2]) .. ")"
    elseif op == "load" then
      local rec = caps[n.x + 1]
      local off = load_offset(n.args, rec.strides)
      return "((const " .. (rec.kind == "i" and "int" or "float") .. " *)AL_CAP(" .. rec.k .. "))[" .. E(off) .. "]"
    end
    error("variants: internal: no CUDA for op " .. tostring(op))
  end
  return E(root)
end

-- The kernels' build switches ATTNLAB_VARIANT_DEFINES may set (each read with #ifndef in kernels/):
local VARIANT_DEFINES = {
  AL_SM90_PINGPONG = true,    -- flash_fwd_sm90.cu: the two consumer warpgroups take turns on the tensor cores (1)
  AL_SM90_PIPE = true,        -- flash_fwd_sm90.cu: S(j+1) issued with O += P(j) V(j) (1 at d <= 128)
  AL_SM90_LEAN_MOD = true,    -- flash_bwd_sm90.cu: bf16 score_mod without capture gradients on the plain path (1)
  AL_TANH_FMA_EVERY = true,   -- flash_fwd_sm90.cu: a bf16 score_mod's tanh on the FMA pipe every k-th column group (0)
  AL_BWD_EX2_FMA_EVERY = true, -- flash_bwd_sm90.cu: the lean path's exponentials on the FMA pipe every k-th column group (0)
  AL_SM90_BWD_EARLY_DP = true, -- flash_bwd_sm90.cu: the dK/dV kernel's order (2: dP^T beside S^T, one pass; 0, 1, 3)
  AL_SM90_BWD_CONSUMER_REGS = true, -- flash_bwd_sm90.cu: the backward consumers' setmaxnreg (224)
  AL_SM90_BWD_DQ_ONE_PASS = true,   -- flash_bwd_sm90.cu: the dQ kernel's P and dS in one pass after S and dP
  AL_SM90_BWD_PINGPONG = true,      -- flash_bwd_sm90.cu: the dQ kernel's two consumer warpgroups take turns (0)
}

local function cuda_prelude(uses)
  local p, defs = {}, {}
  -- ATTNLAB_VARIANT_DEFINES="NAME=N ..." (A/B measurements of the kernels' build switches): each becomes a
  -- #define at the top of every variant source, so it is part of the cache keys. Only switches that leave the
  -- launch (tiles, threads, shared memory) as the host computes it: see VARIANT_DEFINES.
  for def in (os.getenv("ATTNLAB_VARIANT_DEFINES") or ""):gmatch("[^%s,]+") do
    local name, val = def:match("^([%w_]+)=(%d+)$")
    if not (name and VARIANT_DEFINES[name]) then
      local names = {}
      for k in pairs(VARIANT_DEFINES) do names[#names + 1] = k end
      table.sort(names)
      error("ATTNLAB_VARIANT_DEFINES: expected NAME=N items (N a non-negative integer) separated by spaces or " ..
        "commas, NAME one of " .. table.concat(names, ", ") .. "; got '" .. def .. "'", 0)
    end
    p[#p + 1] = string.format("#define %s %s", name, val)
    defs[name] = tonumber(val)
  end
  if uses.mod then
    p[#p + 1] = "static __device__ __forceinline__ int al_v_imod(int a, int m) { int r = a % m; return (r != 0 && ((r < 0) != (m < 0))) ? r + m : r; }"
    p[#p + 1] = "static __device__ __forceinline__ float al_v_fmod(float a, float m) { return a - floorf(a / m) * m; }"
  end
  if uses.iabs then p[#p + 1] = "static __device__ __forceinline__ int al_v_iabs(int a) { return a < 0 ? -a : a; }" end
  if uses.tanh then
    -- bf16 kernels: the hardware tanh (tanh.approx.f32, one MUFU op, relative error 2^-11, below the 2^-9
    -- of P's own bf16 rounding; what FlashAttention's soft-capping uses). f16 kernels (P rounded at
    -- 2^-12): tanh |x| = 1 - 2 / (e^2|x| + 1) with __expf (ex2.approx; inf past |x| ~ 44, giving 1) and
    -- __fdividef (rcp.approx), absolute error < 1e-6. AL_BF16 is a -D option, so the prelude sees it.
    p[#p + 1] = "static __device__ __forceinline__ float al_v_tanh(float x) {\n" ..
      "#if defined(AL_BF16) && AL_BF16\n" ..
      "  float y; asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y;\n" ..
      "#else\n" ..
      "  const float e = __expf(2.0f * fabsf(x)); return copysignf(1.0f - __fdividef(2.0f, e + 1.0f), x);\n" ..
      "#endif\n" ..
      "}"
    -- AL_TANH_FMA_EVERY (an experiment): where the Hopper forward's al_fl_mod_pre says al_tanh_fma_now, the FMA-pipe
    -- al_tanh_fma (kernels/flash_common.cuh); everywhere else this constant false keeps the MUFU tanh
    if (defs.AL_TANH_FMA_EVERY or 0) > 0 then
      p[#p + 1] = "#if defined(AL_BF16) && AL_BF16\n" ..
        "static constexpr bool al_tanh_fma_now = false;\n" ..
        "#define al_v_tanh(x) (al_tanh_fma_now ? al_tanh_fma(x) : al_v_tanh(x))\n" ..
        "#endif"
    end
  end
  if uses.iminmax then
    p[#p + 1] = "static __device__ __forceinline__ int al_v_imin(int a, int b) { return a < b ? a : b; }"
    p[#p + 1] = "static __device__ __forceinline__ int al_v_imax(int a, int b) { return a > b ? a : b; }"
  end
  if uses.mufu then
    -- the expression has its own multi-function-unit operation per score (tanh, exp, log, sqrt) beside the
    -- softmax's exponential: the Hopper forward then computes every k-th column group's exponentials on
    -- the FMA pipe (kernels/flash_common.cuh, AL_EX2_FMA_EVERY; docs/PERFORMANCE.md session 10 for k).
    -- ATTNLAB_VARIANT_EX2_FMA=k sets k (0: off), for measurements.
    local k = tonumber(os.getenv("ATTNLAB_VARIANT_EX2_FMA") or "") or 8
    if k > 0 then p[#p + 1] = string.format("#define AL_EX2_FMA_EVERY %d", math.floor(k)) end
  end
  if #p == 0 then return nil end
  return table.concat(p, "\n") .. "\n"
end

M.gen_cuda, M.cuda_prelude, M.foldable = gen_cuda, cuda_prelude, foldable
return M
