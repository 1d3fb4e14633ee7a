--[[
attnlab.apidoc — the API reference read from the sources: every public C function in
include/attnlab.h with the comment above it, and every al.* function and tensor method with the
comment above its definition (its doc comment) and its parameter names.

  local apidoc = require "attnlab.apidoc"
  apidoc.c_functions()           --> { {name=, decl=, comment=, section=}, ... } in header order
  apidoc.c_function("al_tensor_select")
  apidoc.lua_functions(al)       --> { {name="al.plot.line", params="x, y, opts", comment=, file=}, ... }
  apidoc.markdown(al)            --> docs/REFERENCE.md's text

Used by scripts/gen_api_docs.lua (`make docs`), by the spec that keeps docs/REFERENCE.md current, and
by the REPL's ?name help. Not installed into `al`.
]]
local M = {}

local concat, format = table.concat, string.format

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function header_path()
  local ok, lffi = pcall(require, "attnlab.ffi")
  if ok and lffi.header then return lffi.header end
  local src = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  return src .. "/../../include/attnlab.h"
end

-- Comment text from the lines of a /* ... */ block (leading " * " and the delimiters removed).
local function clean_comment(lines)
  local out = {}
  for _, l in ipairs(lines) do
    local first = l:match("^%s*/%*")
    l = l:gsub("^%s*/%*+ ?", ""):gsub("%s*%*+/%s*$", "")
    if not first then l = l:gsub("^%s*%* ?", "") end
    l = l:gsub("%s+$", "")
    out[#out + 1] = l
  end
  while out[1] == "" do table.remove(out, 1) end
  while out[#out] == "" do table.remove(out) end
  return concat(out, "\n")
end

-- The public C functions of the header: declarations of al_* functions, outside comments, with the
-- comment block right above each (a blank line or code between them detaches it) and the section
-- (the last "/* ----- ... ----- */" banner's title).
function M.c_functions(path)
  path = path or header_path()
  local text = read(path)
  if not text then error("apidoc.c_functions: cannot read " .. tostring(path), 2) end
  local lines = {}
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local out, section, pending = {}, nil, nil
  local i = 1
  while i <= #lines do
    local l = lines[i]
    if l:match("^%s*/%*") then
      -- a comment block (possibly one line)
      local block = { l }
      local j = i
      while not lines[j]:find("%*/") and j < #lines do
        j = j + 1
        block[#block + 1] = lines[j]
      end
      local body = clean_comment(block)
      if body:match("^%-%-%-%-") then
        local title = body:gsub("%-%-%-+", ""):match("^%s*(.-)%s*$")
        if title ~= "" and not title:match("^AL_FFI") then section = title end
        pending = nil
      elseif body:match("^AL_FFI_") then
        pending = nil
      else
        pending = body
      end
      i = j + 1
    elseif l:match("^%s*$") or l:match("^%s*#") then
      pending = nil
      i = i + 1
    else
      -- a declaration: gather it up to ';' or '{'
      local decl = { l }
      local j = i
      while not decl[#decl]:find("[;{]") and j < #lines do
        j = j + 1
        decl[#decl + 1] = lines[j]
      end
      local d = concat(decl, " "):gsub("%s+", " "):gsub("/%*.-%*/", ""):gsub("%s*;.*$", ";")
      local name = d:match("^[%w_ %*]-[%s%*](al_[%w_]+)%s*%(")
      if name and not d:match("^%s*typedef") and not d:match("^%s*static") then
        out[#out + 1] = { name = name, decl = d:match("^%s*(.-)%s*$"), comment = pending or "", section = section }
      end
      pending = nil
      i = j + 1
    end
  end
  return out
end

local c_cache
-- One C function's entry (name, decl, comment, section), or nil.
function M.c_function(name)
  if not c_cache then
    c_cache = {}
    local ok, list = pcall(M.c_functions)
    if ok then for _, e in ipairs(list) do c_cache[e.name] = e end end
  end
  return c_cache[name]
end

-- The comment lines right above line `linedefined` of `file` ("--" comments, not "--[[" blocks), or
-- for a definition inside a "local x = ..." or table literal, the same rule.
local src_cache = {}
local function source_lines(file)
  if src_cache[file] == nil then
    local t = read(file)
    local lines = {}
    if t then for l in (t .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end end
    src_cache[file] = lines
  end
  return src_cache[file]
end

function M.doc_comment(file, linedefined)
  local lines = source_lines(file)
  local doc = {}
  for j = linedefined - 1, 1, -1 do
    local l = lines[j]
    local c = l and l:match("^%s*%-%-+%s?(.-)%s*$")
    if not c or l:match("^%s*%-%-%[%[") or l:match("^%s*%-%-%-%-%-%-%-%-") then break end
    table.insert(doc, 1, c)
  end
  return concat(doc, "\n")
end

local function func_info(f)
  local info = debug.getinfo(f, "Su")
  if info.what == "C" then return { params = "...", file = "[C]", comment = "" } end
  local params = {}
  for i = 1, info.nparams or 0 do
    local p = debug.getlocal(f, i)
    if not p then break end
    params[#params + 1] = p
  end
  if info.isvararg then params[#params + 1] = "..." end
  local file = info.source:match("^@(.*)$") or info.short_src
  local comment = file and M.doc_comment(file, info.linedefined) or ""
  -- the source path relative to the repository (lua/attnlab/x.lua), never an absolute one
  local rel = file and (file:match("(lua/attnlab/.+%.lua)$") or file:match("([^/]+%.lua)$")) or "?"
  return { params = concat(params, ", "), file = rel, comment = comment, self_method = params[1] == "self" }
end

-- Every public function reachable from `al` (fields, then the fields of its tables, two levels
-- down), and every tensor method. Names starting with '_' and the raw FFI (al.C, al.ffi) are left
-- out. Sorted by name; a function reachable under several names is listed under each.
function M.lua_functions(al)
  local out, seen_tables = {}, {}
  local skip = { C = true, ffi = true, Tensor = true }
  local function walk(t, prefix, depth)
    if seen_tables[t] and seen_tables[t] <= depth then return end
    seen_tables[t] = depth
    local keys = {}
    for k in pairs(t) do if type(k) == "string" then keys[#keys + 1] = k end end
    table.sort(keys)        -- a table reachable under two names (al.layout, al.layouts) is walked under the first
    for _, k in ipairs(keys) do
      local v = t[k]
      if not k:match("^_") and not (depth == 0 and skip[k]) then
        local name = prefix .. "." .. k
        if type(v) == "function" then
          local e = func_info(v)
          e.name = name
          out[#out + 1] = e
        elseif type(v) == "table" and depth < 2 and k:match("^[%a][%w_]*$") then
          walk(v, name, depth + 1)
          local mt = getmetatable(v)
          if type(mt) == "table" and type(rawget(mt, "__call")) == "function" then
            local e = func_info(rawget(mt, "__call"))
            e.name = name .. "(...)"
            out[#out + 1] = e
          end
        end
      end
    end
  end
  walk(al, "al", 0)
  local ok, T = pcall(require, "attnlab.tensor")
  if ok then
    for k, v in pairs(T.methods) do
      if type(k) == "string" and not k:match("^_") and type(v) == "function" then
        local e = func_info(v)
        e.name = "Tensor:" .. k
        if e.self_method then e.params = e.params:gsub("^self,? ?", "") end
        out[#out + 1] = e
      end
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

local function indent_block(s)
  if s == "" then return "" end
  local lines = {}
  for l in (s .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  return concat(lines, "\n")
end

-- docs/REFERENCE.md: generated, deterministic (no dates, no absolute paths, no line numbers).
function M.markdown(al)
  local b = {}
  local function add(s) b[#b + 1] = s end
  add("# attnlab API reference")
  add("")
  add("Generated by `scripts/gen_api_docs.lua` (`make docs`) from `include/attnlab.h` and the Lua modules")
  add("in `lua/attnlab/`: do not edit by hand. The text of each entry is the comment right above the")
  add("declaration or definition; `tests/spec/api_docs_spec.lua` fails when this file is out of date.")
  add("For a guided tour see docs/API.md, docs/guide_layouts.md and docs/guide_attention.md. In the REPL,")
  add("`?name` prints the same text.")
  add("")
  add("## Lua: `al.*` functions")
  add("")
  local lua = M.lua_functions(al)
  local methods = {}
  for _, e in ipairs(lua) do
    if e.name:match("^Tensor:") then
      methods[#methods + 1] = e
    else
      add(format("### `%s(%s)`", (e.name:gsub("%(%.%.%.%)$", "")), e.params))
      add("")
      add(format("*%s*", e.file))
      if e.comment ~= "" then add(""); add("```"); add(indent_block(e.comment)); add("```") end
      add("")
    end
  end
  add("## Lua: tensor methods (`t:name(...)`)")
  add("")
  for _, e in ipairs(methods) do
    add(format("### `%s(%s)`", e.name, e.params))
    add("")
    add(format("*%s*", e.file))
    if e.comment ~= "" then add(""); add("```"); add(indent_block(e.comment)); add("```") end
    add("")
  end
  add("## C: `include/attnlab.h`")
  add("")
  local section
  for _, e in ipairs(M.c_functions()) do
    if e.section ~= section then
      section = e.section
      add("### " .. (section or "General"))
      add("")
    end
    add(format("#### `%s`", e.name))
    add("")
    add("```c")
    add(e.decl)
    add("```")
    if e.comment ~= "" then add(""); add(e.comment:gsub("\n", "  \n")) end
    add("")
  end
  add(format("(%d Lua functions, %d tensor methods, %d C functions)", #lua - #methods, #methods, #M.c_functions()))
  return concat(b, "\n") .. "\n"
end

return M
