--[[
attnlab.json — a small JSON encoder/decoder with no dependency, for the results writer (JSON lines)
and the notebook kernel's framed protocol.

  local json = require "attnlab.json"
  json.encode({a = 1, b = {1, 2}})    --> '{"a":1,"b":[1,2]}'   (keys sorted: output is deterministic)
  json.decode('{"a":[1,2,null]}')     --> {a = {1, 2, json.null}}

Tables with keys 1..n (and n > 0) are arrays, other tables objects; an empty table is `{}` unless it
is json.empty_array. NaN and infinities (not JSON) are written as null. Strings are byte strings:
bytes >= 0x80 pass through (UTF-8 in, UTF-8 out); invalid UTF-8 is the caller's business.
Not installed into `al`; other modules require it.
]]
local M = {}

local concat, format, byte, char = table.concat, string.format, string.byte, string.char

M.null = setmetatable({}, { __tostring = function() return "null" end })
M.empty_array = setmetatable({}, { __tostring = function() return "[]" end })

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n",
  ["\r"] = "\\r", ["\t"] = "\\t" }
local function esc_char(c) return escapes[c] or format("\\u%04x", byte(c)) end
local function quote(s) return '"' .. s:gsub('[%c"\\]', esc_char) .. '"' end
M.quote = quote

local function num(v)
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return format("%d", v) end
  local s = format("%.15g", v)             -- the short form when it reads back exactly
  if tonumber(s) ~= v then s = format("%.17g", v) end
  return s
end

local function is_array(t)
  local n = #t
  if n == 0 then return false end
  local count = 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then return false end
    count = count + 1
  end
  return count == n
end

local function enc(v, out, depth)
  local tv = type(v)
  if v == nil or v == M.null then out[#out + 1] = "null"
  elseif tv == "boolean" then out[#out + 1] = tostring(v)
  elseif tv == "number" then out[#out + 1] = num(v)
  elseif tv == "string" then out[#out + 1] = quote(v)
  elseif tv == "cdata" and tonumber(v) then out[#out + 1] = num(tonumber(v))   -- int64 and friends
  elseif tv == "table" then
    if depth > 64 then error("json.encode: nesting deeper than 64 (a cycle?)", depth + 2) end
    if v == M.empty_array then out[#out + 1] = "[]"; return end
    if is_array(v) then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        enc(v[i], out, depth + 1)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= "string" and type(k) ~= "number" then
          error("json.encode: object keys must be strings or numbers, got " .. type(k), depth + 2)
        end
        keys[#keys + 1] = k
      end
      table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = quote(tostring(k))
        out[#out + 1] = ":"
        enc(v[k], out, depth + 1)
      end
      out[#out + 1] = "}"
    end
  else
    error("json.encode: cannot encode a " .. tv, depth + 2)
  end
end

-- json.encode(value) -> string (one line: no newline is ever emitted).
function M.encode(v)
  local out = {}
  enc(v, out, 0)
  return concat(out)
end

---------------------------------------------------------------------------------------------------
-- decoding
---------------------------------------------------------------------------------------------------
local function utf8(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

local function decode_error(s, i, what)
  error(format("json.decode: %s at byte %d (near %q)", what, i, s:sub(i, i + 10)), 0)
end

local parse

local function skip(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

local function parse_string(s, i)
  local parts, j = {}, i + 1
  while true do
    local k = s:find('["\\]', j)
    if not k then decode_error(s, i, "unterminated string") end
    parts[#parts + 1] = s:sub(j, k - 1)
    if s:sub(k, k) == '"' then return concat(parts), k + 1 end
    local e = s:sub(k + 1, k + 1)
    local simple = ({ b = "\b", f = "\f", n = "\n", r = "\r", t = "\t", ['"'] = '"', ["\\"] = "\\", ["/"] = "/" })[e]
    if simple then
      parts[#parts + 1] = simple
      j = k + 2
    elseif e == "u" then
      local cp = tonumber(s:sub(k + 2, k + 5), 16)
      if not cp then decode_error(s, k, "bad \\u escape") end
      j = k + 6
      if cp >= 0xD800 and cp < 0xDC00 and s:sub(j, j + 1) == "\\u" then
        local lo = tonumber(s:sub(j + 2, j + 5), 16)
        if lo and lo >= 0xDC00 and lo < 0xE000 then
          cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00)
          j = j + 6
        end
      end
      parts[#parts + 1] = utf8(cp)
    else
      decode_error(s, k, "bad escape")
    end
  end
end

function parse(s, i)
  i = skip(s, i)
  local c = s:sub(i, i)
  if c == "{" then
    local obj = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "}" then return obj, i + 1 end
    while true do
      if s:sub(i, i) ~= '"' then decode_error(s, i, "expected a string key") end
      local k
      k, i = parse_string(s, i)
      i = skip(s, i)
      if s:sub(i, i) ~= ":" then decode_error(s, i, "expected ':'") end
      local v
      v, i = parse(s, i + 1)
      obj[k] = v
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "}" then return obj, i + 1 end
      if d ~= "," then decode_error(s, i, "expected ',' or '}'") end
      i = skip(s, i + 1)
    end
  elseif c == "[" then
    local arr, n = {}, 0
    i = skip(s, i + 1)
    if s:sub(i, i) == "]" then return arr, i + 1 end
    while true do
      local v
      v, i = parse(s, i)
      n = n + 1
      arr[n] = v
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "]" then return arr, i + 1 end
      if d ~= "," then decode_error(s, i, "expected ',' or ']'") end
      i = i + 1
    end
  elseif c == '"' then
    return parse_string(s, i)
  elseif s:sub(i, i + 3) == "true" then return true, i + 4
  elseif s:sub(i, i + 4) == "false" then return false, i + 5
  elseif s:sub(i, i + 3) == "null" then return M.null, i + 4
  else
    local numstr = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    local v = numstr and tonumber(numstr)
    if not v then decode_error(s, i, "unexpected character") end
    return v, i + #numstr
  end
end

-- json.decode(string) -> value; null becomes json.null (so arrays keep their length).
function M.decode(s)
  if type(s) ~= "string" then error("json.decode: expected a string, got " .. type(s), 2) end
  local v, i = parse(s, 1)
  i = skip(s, i)
  if i <= #s then decode_error(s, i, "trailing characters") end
  return v
end

return M
