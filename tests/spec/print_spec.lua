-- print_spec.lua — tostring(t) (the one-line summary) and t:format()/t:print()/al.print (the values,
-- PyTorch-style, with a Torch7 summary line), and al.set_printoptions.
local al = require "attnlab"

-- Numbers in a printed text, in order ("nan"/"inf" included).
local function numbers(s)
    local r = {}
    for tok in s:gmatch("[%-%w%.%+]+") do
        local v = tonumber(tok)
        if tok == "nan" then v = 0 / 0 elseif tok == "inf" then v = 1 / 0 elseif tok == "-inf" then v = -1 / 0 end
        if v then r[#r + 1] = v end
    end
    return r
end

local function lines(s)
    local r = {}
    for l in (s .. "\n"):gmatch("([^\n]*)\n") do r[#r + 1] = l end
    return r
end

local function flat(tbl, out)
    out = out or {}
    if type(tbl) ~= "table" then out[#out + 1] = tbl return out end
    for _, v in ipairs(tbl) do flat(v, out) end
    return out
end

describe("tostring(t): one-line summary", function()
    it("names dtype, shape, strides and device of a contiguous tensor", function()
        local t = al.zeros({ 2, 3, 4 })
        assert.equal("attnlab.Tensor f32 [2,3,4] strides=[12,4,1] cpu", tostring(t))
        local h = al.zeros({ 5 }, { dtype = "bf16" })
        assert.equal("attnlab.Tensor bf16 [5] strides=[1] cpu", tostring(h))
    end)

    it("adds 'view of #id+offset' for a view that does not cover its storage from 0", function()
        local t = al.randn({ 4, 6 })
        local id = t:storage_id()
        local v = t:select(1, 3)                       -- row 3: offset 2*6
        assert.equal(("attnlab.Tensor f32 [6] strides=[1] cpu view of #%d+12"):format(id), tostring(v))
        local n = t:narrow(2, 2, 3)                    -- columns 2..4: offset 1, strides kept
        assert.equal(("attnlab.Tensor f32 [4,3] strides=[6,1] cpu view of #%d+1"):format(id), tostring(n))
        local first = t:narrow(1, 1, 2)                -- offset 0 but only part of the storage
        assert.truthy(tostring(first):find(("view of #%d+0"):format(id), 1, true))
    end)

    it("shows a transpose's strides and no 'view of' when it covers the whole storage", function()
        local t = al.randn({ 2, 3 }):transpose(1, 2)
        assert.equal("attnlab.Tensor f32 [3,2] strides=[1,3] cpu", tostring(t))
    end)

    it("handles 0-d and released tensors", function()
        assert.equal("attnlab.Tensor f32 [] strides=[] cpu", tostring(al.tensor(2.5)))
        local t = al.ones({ 3 })
        t:free()
        assert.equal("attnlab.Tensor (released)", tostring(t))
    end)
end)

describe("t:format(): values PyTorch-style", function()
    after_each(function() al.set_printoptions("default") end)

    it("aligns columns with precision 4 and ends with the Torch7 summary line", function()
        local t = al.tensor({ { 1.5, -2.25, 3 }, { 40, 5, 6.125 } })
        assert.equal("[[ 1.5000, -2.2500,  3.0000],\n" ..
                     " [40.0000,  5.0000,  6.1250]]\n" ..
                     "[attnlab.Tensor f32 of size 2x3 on cpu]", t:format())
    end)

    it("prints random values that round-trip to 4 decimals, in row-major order", function()
        local t = al.randn({ 3, 5 })
        local want = flat(t:totable())
        local got = numbers(t:format():match("^(.-)\n%[attnlab"))
        assert.equal(#want, #got)
        for i = 1, #want do assert.is_true(math.abs(want[i] - got[i]) <= 0.5e-4 + 1e-6, i) end
    end)

    it("prints a strided view's own values (a transpose)", function()
        local t = al.randn({ 4, 3 })
        local v = t:transpose(1, 2)
        local want = flat(v:contiguous():totable())
        local got = numbers(v:format():match("^(.-)\n%[attnlab"))
        assert.equal(12, #got)
        for i = 1, 12 do assert.is_true(math.abs(want[i] - got[i]) <= 0.5e-4 + 1e-6, i) end
        assert.equal(4, #lines(v:format()))               -- 3 rows + summary
    end)

    it("separates 3-d blocks with a blank line", function()
        local t = al.randn({ 2, 2, 3 })
        local l = lines(t:format())
        assert.equal(6, #l)                               -- 2 + blank + 2 + summary
        assert.equal("", l[3])
        assert.truthy(l[1]:match("^%[%[%["))
        assert.equal("[attnlab.Tensor f32 of size 2x2x3 on cpu]", l[6])
    end)

    it("prints integers, booleans, nan and inf", function()
        assert.equal("[[1, 1],\n [1, 1]]\n[attnlab.Tensor i32 of size 2x2 on cpu]",
                     al.ones({ 2, 2 }, { dtype = "i32" }):format())
        assert.equal("[1, 0, 1]\n[attnlab.Tensor bool of size 3 on cpu]",
                     al.tensor({ true, false, true }, { dtype = "bool" }):format())
        assert.equal("[1.5000,    nan,    inf,   -inf]",
                     lines(al.tensor({ 1.5, 0 / 0, 1 / 0, -1 / 0 }):format())[1])
    end)

    it("uses '1.' for integral floats and scientific notation for wide ranges", function()
        assert.equal("[1., 2., 3.]", lines(al.tensor({ 1, 2, 3 }):format())[1])
        assert.equal("[1.0000e-06, 1.0000e+00]", lines(al.tensor({ 1e-6, 1 }):format())[1])
    end)

    it("prints 0-d and empty tensors", function()
        assert.equal("2.5000\n[attnlab.Tensor f32 scalar on cpu]", al.tensor(2.5):format())
        assert.equal("[]\n[attnlab.Tensor f32 of size 0x3 on cpu]", al.zeros({ 0, 3 }):format())
    end)

    it("summarises above 1000 elements: 3 edge items per long dim", function()
        local t = al.randn({ 2000 })
        local all = flat(t:totable())
        local l = lines(t:format())
        assert.equal(2, #l)
        assert.truthy(l[1]:find(", ..., ", 1, true))
        local got = numbers(l[1])
        assert.equal(6, #got)
        local want = { all[1], all[2], all[3], all[1998], all[1999], all[2000] }
        for i = 1, 6 do assert.is_true(math.abs(want[i] - got[i]) <= 0.5e-4 + 1e-6, i) end

        local m = al.randn({ 40, 50 })
        local ml = lines(m:format())
        assert.equal(8, #ml)                              -- 3 rows, "...", 3 rows, summary
        assert.equal(" ...,", ml[4])
        local rows = m:totable()
        local last = numbers(ml[7])
        assert.equal(6, #last)
        assert.is_true(math.abs(last[6] - rows[40][50]) <= 0.5e-4 + 1e-6)
        assert.is_true(math.abs(last[1] - rows[40][1]) <= 0.5e-4 + 1e-6)
    end)

    it("does not leak the temporary views it reads through", function()
        local t = al.randn({ 30, 40, 5 })
        collectgarbage(); collectgarbage()
        local before = tonumber(al.C.al_storage_live_count())
        for _ = 1, 5 do t:format() end
        collectgarbage(); collectgarbage()
        assert.equal(before, tonumber(al.C.al_storage_live_count()))
    end)

    it("follows set_printoptions: precision, threshold, edgeitems, linewidth", function()
        local t = al.tensor({ 0.123456, -1.5 })
        al.set_printoptions({ precision = 2 })
        assert.equal("[ 0.12, -1.50]", lines(t:format())[1])

        al.set_printoptions({ precision = 4, threshold = 5, edgeitems = 2 })
        local r = al.arange(0, 12, { dtype = "f32" })
        assert.equal("[ 0.,  1., ..., 10., 11.]", lines(r:format())[1])

        al.set_printoptions({ threshold = 1000, linewidth = 30 })
        local w = al.randn({ 20 })
        local l = lines(w:format())
        assert.truthy(#l > 3)
        for i = 1, #l - 1 do assert.is_true(#l[i] <= 30, l[i]) end
        assert.equal(20, #numbers(table.concat(l, "\n", 1, #l - 1)))

        assert.has_error(function() al.set_printoptions({ precison = 3 }) end)
        assert.has_error(function() al.set_printoptions({ precision = -1 }) end)
    end)

    it("t:print() and al.print(t) write the same text as t:format()", function()
        local t = al.randn({ 2, 2 })
        local buf = {}
        local real = io.write
        io.write = function(...) for _, s in ipairs({ ... }) do buf[#buf + 1] = tostring(s) end end -- luacheck: ignore 122
        local ok, err = pcall(function()
            t:print()
            al.print(t)
        end)
        io.write = real -- luacheck: ignore 122
        assert(ok, err)
        local text = t:format() .. "\n"
        assert.equal(text .. text, table.concat(buf))
    end)
end)

describe("printing cuda tensors #gpu", function()
    it("shows the same values as the cpu copy", function()
        if not HAS_GPU then pending("no usable GPU") return end
        local c = al.randn({ 50, 60 })
        local g = c:to("cuda")
        assert.truthy(tostring(g):find(" cuda:0", 1, true))
        local gl, cl = lines(g:format()), lines(c:format())
        assert.equal(#cl, #gl)
        for i = 1, #cl - 1 do assert.equal(cl[i], gl[i]) end
        assert.equal("[attnlab.Tensor f32 of size 50x60 on cuda:0]", gl[#gl])
    end)
end)
