-- tests/c/variant_snippets.lua — writes the CUDA snippets that lua/attnlab/variants.lua generates for the
-- example variants (examples/variants.lua) to stdout, for build/tests/test_nvrtc_kernels to compile with
-- NVRTC on a machine without a GPU: CI then catches generated code that no longer compiles, not only the
-- hand-written hooks. `make test` writes $(BUILD)/variant_snippets.txt with it before the C tests run.
-- Format, per variant: "variant NAME BLOCK_MASK\n", then per snippet given "KEY LENGTH\n" + LENGTH bytes
-- + "\n" (KEY: score_mod score_grad mask_mod capture_grad prelude score_pre score_post score_grad_pre score_lo
-- score_hi), then "end\n".
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
_G.al = al
_G.VARIANTS_EXAMPLE_LIB = true
local make = dofile("examples/variants.lua")
_G.VARIANTS_EXAMPLE_LIB = nil

local EX = make(200, 4, 2)
local KEYS = { "score_mod", "score_grad", "mask_mod", "capture_grad", "prelude", "score_pre", "score_post",
  "score_grad_pre", "score_lo", "score_hi" }
local function emit(name, score_mod, mask_mod, block_mask)
  local s = al.attention.variant({ score_mod = score_mod, mask_mod = mask_mod }):source()
  io.write(string.format("variant %s %d\n", name, block_mask and 1 or 0))
  for _, k in ipairs(KEYS) do
    local v = s[k]
    if v ~= nil then
      v = type(v) == "number" and string.format("%.17g", v) or v
      io.write(string.format("%s %d\n", k, #v), v, "\n")
    end
  end
  io.write("end\n")
end

local names = {}
for name in pairs(EX) do names[#names + 1] = name end
table.sort(names)
for _, name in ipairs(names) do
  local x = EX[name]
  emit(name, x.score_mod, x.mask_mod, x.mask_mod ~= nil)
end
-- every hook at once: soft-capping plus the relative bias (a parameter) under the document mask
local soft, rel, doc = EX.softcap.score_mod, EX.relative_bias.score_mod, EX.document.mask_mod
emit("softcap+relative_bias+document", function(score, b, h, q, kv) return soft(rel(score, b, h, q, kv)) end,
  doc, true)
-- the kernels' build switches under measurement (ATTNLAB_VARIANT_DEFINES, lua/attnlab/variants/cuda.lua): the sliced
-- score_mod backward (the lean one is the default, compiled by the rows above), the forward without ping-pong, the
-- FMA-pipe tanh, the lean backward's FMA-pipe exponentials, the folded backward, so that CI compiles them (no spills,
-- no serialised wgmma)
local ffi = require "ffi"
pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES", "AL_SM90_LEAN_MOD=0 AL_SM90_PINGPONG=0", 1)
emit("softcap[sliced,pp0]", soft, nil, false)
emit("alibi[sliced,pp0]", EX.alibi.score_mod, nil, false)
emit("softcap+document[sliced,pp0]", soft, doc, true)
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES", "AL_TANH_FMA_EVERY=4", 1)
emit("softcap[tanhfma4]", soft, nil, false)
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES", "AL_BWD_EX2_FMA_EVERY=4", 1)
emit("softcap+document[bwdex2fma4]", soft, doc, true)
-- the backward's element-pass orders (AL_SM90_BWD_EARLY_DP 2, the default, with the dQ kernel's one pass, and 3), with
-- the consumers' 232 registers that keep the soft-capped dK/dV kernel free of spills under them
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES",
  "AL_SM90_BWD_EARLY_DP=2 AL_SM90_BWD_DQ_ONE_PASS=1 AL_SM90_BWD_CONSUMER_REGS=232", 1)
emit("softcap[edp2,dq1pass,r232]", soft, nil, false)
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES", "AL_SM90_BWD_EARLY_DP=3 AL_SM90_BWD_CONSUMER_REGS=232", 1)
emit("softcap[edp3,r232]", soft, nil, false)
-- mode 0, the default order until session 28 (dP^T after the P step)
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES", "AL_SM90_BWD_EARLY_DP=0", 1)
emit("softcap+document[edp0]", soft, doc, true)
-- the dQ kernel's consumers taking turns (AL_SM90_BWD_PINGPONG), beside a block-masked document mask_mod
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES", "AL_SM90_BWD_PINGPONG=1", 1)
emit("softcap+document[dqpp]", soft, doc, true)
-- the unfolded backward (ATTNLAB_VARIANT_FOLD_GRAD=0: no score_grad_pre; the folded one is the default since
-- session 24) on the lean path, and on the sliced one beside a block-masked mask_mod
ffi.C.unsetenv("ATTNLAB_VARIANT_DEFINES")
ffi.C.setenv("ATTNLAB_VARIANT_FOLD_GRAD", "0", 1)
emit("softcap[nofoldgrad]", soft, nil, false)
ffi.C.setenv("ATTNLAB_VARIANT_DEFINES", "AL_SM90_LEAN_MOD=0", 1)
emit("softcap+document[nofoldgrad,sliced]", soft, doc, true)
ffi.C.unsetenv("ATTNLAB_VARIANT_FOLD_GRAD")
ffi.C.unsetenv("ATTNLAB_VARIANT_DEFINES")
