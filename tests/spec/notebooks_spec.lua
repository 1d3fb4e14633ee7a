-- notebooks_spec.lua — every notebooks/*.ipynb executed headless with the attnlab Jupyter kernel on
-- the CPU (jupyter nbconvert --execute; any cell error fails it), the executed outputs checked (no
-- error outputs; a figure where a notebook draws one), and the kernel protocol itself driven through
-- jupyter_client by tests/notebooks/kernel_check.py (streams, figures, errors, completion, interrupt,
-- restart). Pending, with the reason, when Debian's Jupyter packages are not installed
-- (`make deps-notebook` installs them).
local json = require "attnlab.json"
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
if root:sub(1, 1) ~= "/" then root = os.getenv("PWD") .. "/" .. root end
local PY = "/usr/bin/python3"   -- Debian's python, where python3-ipykernel lives (not a pyenv shim)

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"__rc=$?\""))
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return out:gsub("__rc=%d+%s*$", ""), rc
end

local missing
do
  local _, rc1 = run("command -v jupyter-nbconvert >/dev/null")
  local _, rc2 = run(PY .. " -c 'import ipykernel, nbclient, jupyter_client' >/dev/null 2>&1")
  if rc1 ~= 0 or rc2 ~= 0 then
    missing = "Jupyter is not installed (jupyter-nbconvert, python3-ipykernel, python3-nbclient): run `make deps-notebook`"
  end
end

local libdir = os.getenv("ATTNLAB_LIBDIR") or (root .. "/lib")
local tmp = os.tmpname()
os.remove(tmp)
local jupyter_env

local function notebooks()
  local list = {}
  local p = io.popen("ls " .. sh_quote(root .. "/notebooks") .. "/*.ipynb 2>/dev/null")
  for f in p:lines() do list[#list + 1] = f end
  p:close()
  return list
end

describe("notebooks (executed headless with the attnlab kernel)", function()
  setup(function()
    if missing then return end
    local out, rc = run("sh " .. sh_quote(root .. "/notebooks/kernel/make_spec.sh") .. " " .. sh_quote(tmp) .. " "
      .. sh_quote(root) .. " " .. sh_quote(libdir))
    assert(rc == 0, out)
    -- JUPYTER_DATA_DIR/RUNTIME_DIR in the scratch folder: a test never writes into ~/.local/share/jupyter
    jupyter_env = "JUPYTER_PATH=" .. sh_quote(tmp) .. " JUPYTER_RUNTIME_DIR=" .. sh_quote(tmp .. "/runtime")
      .. " PYDEVD_DISABLE_FILE_VALIDATION=1 ATTNLAB_LIBDIR=" .. sh_quote(libdir)
  end)
  teardown(function() os.execute("rm -rf " .. sh_quote(tmp)) end)

  it("finds the notebooks", function()
    local nbs = notebooks()
    assert.is_true(#nbs >= 2, "expected at least 01 and 02 in notebooks/")
  end)

  for _, nb in ipairs(notebooks()) do
    local name = nb:match("([^/]+)%.ipynb$")
    it("runs " .. name .. " with no cell error", function()
      if missing then pending(missing) return end
      local out, rc = run(jupyter_env .. " timeout 600 jupyter-nbconvert --to notebook --execute"
        .. " --ExecutePreprocessor.kernel_name=attnlab --ExecutePreprocessor.timeout=300"
        .. " --output-dir " .. sh_quote(tmp .. "/out") .. " " .. sh_quote(nb))
      assert(rc == 0, "nbconvert failed (exit " .. tostring(rc) .. "):\n" .. out)
      local f = assert(io.open(tmp .. "/out/" .. name .. ".ipynb"))
      local doc = json.decode(f:read("*a"))
      f:close()
      local code_cells, with_output, svg = 0, 0, 0
      for _, cell in ipairs(doc.cells) do
        if cell.cell_type == "code" then
          code_cells = code_cells + 1
          if #cell.outputs > 0 then with_output = with_output + 1 end
          for _, o in ipairs(cell.outputs) do
            assert.are_not.equal("error", o.output_type, "a cell raised: " .. tostring(o.evalue))
            if o.data and o.data["image/svg+xml"] then svg = svg + 1 end
          end
        end
      end
      assert.is_true(code_cells > 0)
      assert.is_true(with_output >= code_cells / 2, "most cells should show something")
      assert.is_true(svg >= 1, name .. " should draw at least one figure (image/svg+xml)")
    end)
  end

  it("kernel protocol: streams, values, figures, errors, completion, interrupt, restart", function()
    if missing then pending(missing) return end
    local out, rc = run(jupyter_env .. " timeout 300 " .. PY .. " " .. sh_quote(root .. "/tests/notebooks/kernel_check.py"))
    assert(rc == 0 and out:find("kernel_check: %d+ ok, 0 not ok"), out)
  end)
end)
