-- scripts/cli_args.lua — the argument checks the GPU probe scripts share (scripts/flash_probe.lua,
-- scripts/fp8_repeat_probe.lua): each malformed value is an error that names the option, what it expects and what
-- it got, then the script's usage line, exit 2 (tests/spec/gpu_scripts_spec.lua checks them on any machine).
local M = {}

-- err(msg): msg and the usage line on stderr, exit 2
function M.usage_error(script, usage)
  return function(msg)
    io.stderr:write(script .. ": " .. msg .. "\n" .. usage .. "\n")
    os.exit(2)
  end
end

-- "b,h,s,d" -> { b, h, s, d } (positive integers)
function M.shape(v, err)
  local b, h, s, d = v:match("^(%d+),(%d+),(%d+),(%d+)$")
  local t = { tonumber(b), tonumber(h), tonumber(s), tonumber(d) }
  if not b or t[1] < 1 or t[2] < 1 or t[3] < 1 or t[4] < 1 then
    err("--shape expects b,h,s,d (positive integers), got " .. v)
  end
  return t
end

-- "no_mask" or "causal"
function M.mask(v, err)
  if v ~= "no_mask" and v ~= "causal" then err("--mask expects no_mask or causal, got " .. v) end
  return v
end

-- an integer >= lo for option --name
function M.int(name, v, lo, err)
  if not v:match("^%d+$") or tonumber(v) < lo then
    err("--" .. name .. (lo == 1 and " expects a positive integer, got " or " expects an integer >= " .. lo .. ", got ") .. v)
  end
  return tonumber(v)
end

return M
