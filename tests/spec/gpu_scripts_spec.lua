-- gpu_scripts_spec.lua — the GPU-only benchmark scripts on any machine: a mistyped argument is an error that
-- names it (exit 2, a usage line), checked before the GPU is looked for; without a GPU (ATTNLAB_DISABLE_CUDA=1
-- makes every machine one) they say they skipped and exit 0, so `make bench` passes on a CPU.
package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local q, sh = shell.q, shell.sh
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."

local function run(script, args)
  return sh("cd " .. q(root) .. " && ATTNLAB_DISABLE_CUDA=1 luajit " .. script .. " " .. args)
end

describe("GPU-only scripts", function()
  local cases = {
    { "bench/flash_bench.lua", "--shape=1,2,3", "--shape expects b,h,s,d" },
    { "bench/flash_bench.lua", "--shape=4,16,x,128", "--shape expects b,h,s,d" },
    { "bench/flash_bench.lua", "--shape=4,16,0,128", "--shape expects b,h,s,d" },
    { "bench/flash_bench.lua", "--quik", "unknown argument --quik" },
    { "scripts/flash_sched_ab.lua", "--rounds=0", "--rounds expects a positive integer, got 0" },
    { "scripts/flash_sched_ab.lua", "--env=NOT-A-NAME", "--env expects an environment variable's name" },
    { "scripts/flash_sched_ab.lua", "--modes", "unknown argument --modes" },
    { "scripts/flash_probe.lua", "--shape=4,16,4096", "--shape expects b,h,s,d" },
    { "scripts/flash_probe.lua", "--mask=window", "--mask expects no_mask or causal, got window" },
    { "scripts/flash_probe.lua", "--dtype=f32", "--dtype expects bf16 or f16, got f32" },
    { "scripts/flash_probe.lua", "--calls=0", "--calls expects a positive integer, got 0" },
    { "scripts/flash_probe.lua", "--shape", "unknown argument --shape" },
    { "scripts/flash_probe.lua", "--softcap=0", "--softcap expects a positive number, got 0" },
    { "scripts/fp8_repeat_probe.lua", "--shape=2,4,128", "--shape expects b,h,s,d" },
    { "scripts/fp8_repeat_probe.lua", "--mask=padding", "--mask expects no_mask or causal, got padding" },
    { "scripts/fp8_repeat_probe.lua", "--reps=1", "--reps expects an integer >= 2, got 1" },
    { "scripts/fp8_repeat_probe.lua", "--pack", "unknown argument --pack" },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " " .. c[2] .. ": an error naming it", function()
      local out, rc = run(c[1], c[2])
      assert.equal(2, rc, out)
      assert(out:find(c[3], 1, true), "expected '" .. c[3] .. "' in:\n" .. out)
      assert(out:find("usage: luajit " .. c[1], 1, true), "no usage line in:\n" .. out)
    end)
  end

  for _, c in ipairs({ { "bench/flash_bench.lua", "--shape=2,4,256,64 --quick", "flash_bench: skipped, no usable GPU" },
    { "scripts/flash_sched_ab.lua", "--modes=0,default,4 --rounds=3 --env=ATTNLAB_FLASH_SCHED",
      "flash_sched_ab: skipped, no usable GPU" },
    { "scripts/flash_probe.lua", "--shape=2,4,256,64 --mask=causal --dtype=f16 --calls=2 --softcap=30",
      "flash_probe: skipped, no usable GPU" },
    { "scripts/fp8_repeat_probe.lua", "--shape=2,4,256,128 --mask=no_mask --reps=4 --packed",
      "fp8_repeat_probe: skipped, no usable GPU" } }) do
    it(c[1] .. " with good arguments and no GPU: skipped, exit 0", function()
      local out, rc = run(c[1], c[2])
      assert.equal(0, rc, out)
      assert(out:find(c[3], 1, true), out)
    end)
  end
end)
