"""The chat page in a real headless browser (Debian chromium + chromium-driver, driven by selenium):
load GET /, send a message, and see streamed text arrive in the reply bubble with a tokens/s
figure. Also: the reply's text equals a non-streamed request with the same greedy settings (the
page sends temperature 0 here), so the page joins deltas correctly."""
import json
import os
import sys
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

NINFER, MODEL = sys.argv[1], sys.argv[2]
s = Server(NINFER, MODEL)
ok = False
driver = None
try:
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    driver.get(s.url + "/")
    driver.execute_script("document.getElementById('temp').value = '0'; document.getElementById('max').value = '24';")
    driver.find_element(By.ID, "input").send_keys("hello")
    driver.find_element(By.ID, "send").click()
    WebDriverWait(driver, 60).until(lambda d: "tokens/s" in d.find_element(By.ID, "stats").text and
                                    "first token" in d.find_element(By.ID, "stats").text)
    bubbles = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")
    shown = driver.execute_script("return document.querySelector('.msg.assistant').lastChild.textContent;")
    body = json.dumps({"messages": [{"role": "user", "content": "hello"}], "temperature": 0, "max_tokens": 24})
    req = urllib.request.Request(s.url + "/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"})
    want = json.loads(urllib.request.urlopen(req, timeout=30).read())["choices"][0]["message"]["content"]
    print("stats:", driver.find_element(By.ID, "stats").text)
    ok = len(bubbles) == 1 and shown == want and len(shown) > 0
    print("page reply %r, API reply %r" % (shown, want))
finally:
    if driver:
        driver.quit()
    rc = s.stop()
print("ok" if ok and rc == 0 else "FAIL")
sys.exit(0 if ok and rc == 0 else 1)
